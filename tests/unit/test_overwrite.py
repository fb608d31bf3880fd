"""What the overwrite options may replace (granndis_hpc/outputs.py): predict's --overwrite, build's
--overwrite, train's --overwrite-run, and chunk's and report's --out replace only what the same command
wrote there.  A foreign directory, what the command reads, the current directory, a device and a symbolic
link (its target) are refused with one line saying what is there, and left exactly as they were.

Before: `predict --out X --overwrite` deleted X whatever it was (a user's directory, the model's run
directory, /dev/null, `.`) with exit status 0, and the other commands had a rule each."""
import os
import re
import stat

import pytest

from granndis_hpc.cluster.errors import ClusterError
from granndis_hpc.engine.predict_io import read_output
from granndis_hpc.preprocess.__main__ import main as preprocess
from granndis_hpc.report.command import main as report
from granndis_hpc.shards import ShardError
from tests.unit.test_predict_files import predict, toy  # noqa: F401 (toy: the predict fixture)
from tests.unit.test_report import write_run
from tests.unit.test_run_files import one_rank_set, train  # noqa: F401 (one_rank_set: the training fixture)
from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")


def snapshot(path) -> dict:
    """Every file under `path` (or the file itself), with its bytes; a link or device by what it is."""
    path = str(path)
    if os.path.islink(path) or not (os.path.isdir(path) or os.path.isfile(path)):
        return {path: (os.path.islink(path) and os.readlink(path), stat.S_IFMT(os.lstat(path).st_mode))}
    if os.path.isfile(path):
        return {path: open(path, "rb").read()}
    return {os.path.join(d, n): open(os.path.join(d, n), "rb").read() for d, _, names in os.walk(path) for n in names}


@pytest.fixture
def mine(tmp_path):
    """A user's directory, with a file of theirs; and a link to it."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("the user's own notes")
    os.symlink(d, tmp_path / "link")
    return d


def places(tmp_path, mine, run=None, option=""):
    """(--out, what the refusal says, what must be left as it was) for each place that is not the
    command's to replace; `run`: the run directory the command reads its model from with `option`."""
    cases = {"foreign": (str(mine), "holds notes.txt, not", mine),
             "cwd": (".", "is the current directory", mine),
             "device": ("/dev/null", "is a character device", "/dev/null"),
             "link": (str(tmp_path / "link"), f"is a symbolic link (to {mine})", mine)}
    if run is not None:
        cases["model"] = (str(run), f"holds what {option} {run} reads", run)
    return cases


# ---------------------------------------------------------------------------------------------
# granndis predict --overwrite


@pytest.mark.parametrize("case", ["foreign", "model", "cwd", "device", "link"])
def test_predict_overwrite_refuses_what_predict_did_not_write(toy, tmp_path, mine, monkeypatch, case):  # noqa: F811
    base = toy[0]
    out, says, kept = places(tmp_path, mine, base / "run", "--model")[case]
    if case == "cwd":
        monkeypatch.chdir(mine)
    before = snapshot(kept)
    with pytest.raises(ClusterError, match=re.escape(says)) as err:
        predict(base, "--out", out, "--overwrite")
    assert "\n" not in str(err.value)
    assert snapshot(kept) == before


def test_predict_overwrite_replaces_its_own_output_in_either_format(toy):  # noqa: F811
    base = toy[0]
    out = base / "preds"
    predict(base, "--out", out, "--split", "test")
    first = read_output(str(out))[1]["created_unix_s"]
    with pytest.raises(ClusterError, match=re.escape(f"--out {out} already exists and holds predictions (")):
        predict(base, "--out", out)
    predict(base, "--out", out, "--overwrite", "--split", "val")
    got, prov = read_output(str(out))
    assert prov["split"] == "val" and prov["created_unix_s"] > first
    predict(base, "--out", out, "--overwrite", "--format", "hdf5")  # the directory becomes a file
    assert os.path.isfile(out) and read_output(str(out))[1]["split"] == "all"
    assert [n for n in os.listdir(base) if n.startswith(".")] == []  # no partial or old output left


# ---------------------------------------------------------------------------------------------
# granndis train --overwrite-run


@pytest.mark.parametrize("case", ["foreign", "model", "cwd", "device", "link"])
def test_overwrite_run_refuses_what_train_did_not_write(one_rank_set, tmp_path, mine, monkeypatch, case):  # noqa: F811
    (mine / "config.json").write_text('{"project": "the user\'s own config"}')
    run = tmp_path / "train-run"
    if case == "model":
        train(one_rank_set, run)
    out, says, kept = places(tmp_path, mine, run, "--init-from")[case]
    if case == "foreign":  # only the run's own files are replaced: the user's config.json is what is refused
        says = "it holds config.json, not a training run written by granndis train"
    if case == "cwd":
        train(one_rank_set, mine / "run")
        monkeypatch.chdir(mine / "run")
        kept = mine / "run"
    before = snapshot(kept)
    with pytest.raises(ClusterError, match=re.escape(says)):
        train(one_rank_set, out, "--overwrite-run", *(["--init-from", run] if case == "model" else []))
    assert snapshot(kept) == before


def test_overwrite_run_replaces_only_the_runs_own_files(one_rank_set, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    train(one_rank_set, run)
    (run / "notes.txt").write_text("kept")
    train(one_rank_set, run, "--overwrite-run", "--seed", "1")
    assert (run / "notes.txt").read_text() == "kept"
    assert '"seed": 1' in (run / "config.json").read_text()


# ---------------------------------------------------------------------------------------------
# granndis preprocess build --overwrite, chunk --out


@pytest.mark.parametrize("case", ["foreign", "cwd", "device", "link", "another manifest"])
def test_build_overwrite_refuses_what_build_did_not_write(tmp_path, mine, monkeypatch, case):
    graph = make_graph(n=120, m=400)
    shard_set = tmp_path / "set"
    build(graph, shard_set, servers=1, gpus_per_server=1)
    if case == "another manifest":
        (mine / "notes.txt").unlink()
        (mine / "manifest.json").write_text('{"name": "another tool\'s manifest"}')
        out, says, kept = str(mine), "holds manifest.json, not a shard set", mine
    else:
        out, says, kept = places(tmp_path, mine)[case]
    if case == "cwd":
        monkeypatch.chdir(shard_set)
        kept = shard_set
    before = snapshot(kept)
    with pytest.raises(ShardError, match=re.escape(says)):
        build(graph, out, servers=1, gpus_per_server=1, overwrite=True)
    assert snapshot(kept) == before


@pytest.mark.parametrize("case", ["foreign", "device", "link"])
def test_chunk_refuses_anything_but_a_new_path_or_an_empty_directory(tmp_path, mine, capsys, case):
    out, says, kept = places(tmp_path, mine)[case]
    if case == "foreign":
        says = "holds notes.txt: granndis preprocess chunk writes only to a path that does not exist or an empty"
    before = snapshot(kept)
    assert preprocess(["chunk", "--source", "synthetic", "--vertices", "40", "--features", "2", "--classes", "2",
                       "--out", out, "--chunks", "1"]) == 1
    assert says in capsys.readouterr().err
    assert snapshot(kept) == before
    (tmp_path / "empty").mkdir()
    assert preprocess(["chunk", "--source", "synthetic", "--vertices", "40", "--features", "2", "--classes", "2",
                       "--out", str(tmp_path / "empty"), "--chunks", "1"]) == 0


# ---------------------------------------------------------------------------------------------
# granndis report --out


def test_report_replaces_its_own_report_and_nothing_else(tmp_path, mine, capsys):
    run, _ = write_run(tmp_path, "fb-1", "fb")
    (mine / "report.md").write_text("# the user's own report\n")
    for out, says in ((mine, "holds report.md, not a report written by granndis report"),
                      ("/dev/null", "is a character device"), (tmp_path / "link", "is a symbolic link")):
        before = snapshot(out)
        assert report([str(run), "--out", str(out)]) == 2
        assert says in capsys.readouterr().err
        assert snapshot(out) == before
    assert report([str(run)]) == 0 and report([str(run)]) == 0  # its own report, refreshed
    assert (run / "report.md").read_text().startswith("# granndis report\n")
