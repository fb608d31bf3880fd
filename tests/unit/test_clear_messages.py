"""Tracebacks and misleading messages (docs/reliability.md, "declared counts, full disks, damaged run
files"): each is now the project's one-line error saying what is wrong and how to fix it."""
import builtins
import os

import pytest

from granndis_hpc.preprocess.__main__ import main
from tests.unit.test_shards import build, make_graph


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("msgset") / "set"
    build(make_graph(n=120, m=400), out, servers=1, gpus_per_server=1)
    return out


def test_verify_of_an_unreadable_server_file_names_it(small_set, monkeypatch, capsys):
    """A user who cannot read the set's server file got a PermissionError traceback from verify."""
    real_open = builtins.open

    def denied(path, *a, **k):
        if str(path).endswith("server-0000.h5"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", denied)
    assert main(["verify", str(small_set)]) == 1
    out = capsys.readouterr().out
    assert "server-0000.h5: cannot be read by this user (Permission denied); fix its permissions" in out, out


def test_a_config_file_that_never_ends_or_holds_a_huge_value_is_refused_short(tmp_path, capsys):
    """--config /dev/zero was a MemoryError; a TOML `out` of 10 MB was echoed whole."""
    with pytest.raises(SystemExit) as exit_:
        main(["verify", "--config", "/dev/zero", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "config file '/dev/zero' is larger than 1024 KiB: not an options file" in err, err
    cfg = tmp_path / "big.toml"
    cfg.write_text('out = "' + "x" * 600_000 + '"\n')
    with pytest.raises(SystemExit):
        main(["build", "--config", str(cfg), "--source", "synthetic", "--vertices", "50"])
    err = capsys.readouterr().err
    assert "a value of 600000 characters (starting 'xxxxxxxxxxxxxxxxxxxxxxxx'); option values are at most 4096" in err
    assert len(err) < 5000, len(err)


def test_auto_names_the_shard_set_of_like_options_and_suggests_co_batches_only_where_they_help():
    from granndis_hpc.memory_model.choice import Option, choose

    MiB = 1 << 20
    # Two sets each offer "cob batches=2" (sizes differ): the reason says which set each is on.
    opts = [Option("cob", batches=2, peak=900 * MiB, source="cora-full"),
            Option("cob", batches=2, peak=300 * MiB, source="cora-eas"),
            Option("fb", peak=2000 * MiB, source="cora-full")]
    d = choose(opts, 500 * MiB)
    assert d.choice is opts[1] and "cob batches=2 [cora-eas] is the first" in d.reason, d.reason
    assert "cob batches=2 [cora-full] (900 MiB)" in d.reason, d.reason
    # Nothing fits: more co-batches are suggested only while the estimates still fell with them.
    flat = [Option("cob", batches=b, peak=400 * MiB, source="s") for b in (2, 4, 8)]
    d = choose(flat, 100 * MiB)
    assert d.choice is None and "co-batches" not in d.reason, d.reason
    falling = [Option("cob", batches=b, peak=(800 // b) * MiB, source="s") for b in (2, 4, 8)]
    assert "or more co-batches" in choose(falling, 10 * MiB).reason


@pytest.mark.parametrize("umask,mode", [(0o022, 0o755), (0o027, 0o750)])
def test_preprocess_chunk_output_follows_the_umask(tmp_path, umask, mode):
    """The chunked directory was 0700 under umask 022: another user was told "cannot parse metadata.json"."""
    import stat

    old = os.umask(umask)
    try:
        assert main(["chunk", "--source", "synthetic", "--generator", "sbm", "--vertices", "40", "--avg-degree", "3",
                     "--features", "2", "--classes", "2", "--seed", "1", "--out", str(tmp_path / "c"),
                     "--chunks", "1"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == mode
    assert stat.S_IMODE(os.stat(tmp_path / "c" / "metadata.json").st_mode) == mode & 0o666


SMALL_BUILD = ["build", "--source", "synthetic", "--vertices", "200", "--seed", "0", "--servers", "1",
               "--gpus-per-server", "1", "--layers", "1", "--partitioner", "random"]


def test_a_build_profile_in_a_missing_directory_is_refused_before_the_build(tmp_path, monkeypatch, capsys):
    """GRANNDIS_BUILD_PROFILE naming a missing directory failed a complete, verified build with status 1."""
    monkeypatch.setenv("GRANNDIS_BUILD_PROFILE", str(tmp_path / "missing" / "profile.json"))
    assert main([*SMALL_BUILD, "--out", str(tmp_path / "set")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"GRANNDIS_BUILD_PROFILE={tmp_path / 'missing' / 'profile.json'}: directory "
                        f"{tmp_path / 'missing'} does not exist, so the build's profile could not be written; give "
                        f"a writable file path, or unset GRANNDIS_BUILD_PROFILE") and len(err.splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == []  # refused before anything was written
    monkeypatch.setenv("GRANNDIS_BUILD_PROFILE", str(tmp_path / "profile.json"))
    assert main([*SMALL_BUILD, "--out", str(tmp_path / "set")]) == 0
    assert "load" in (tmp_path / "profile.json").read_text()


def test_a_profile_that_cannot_be_written_after_the_build_is_a_warning(tmp_path, caplog):
    """The set is complete by then: a profile whose directory went away meanwhile does not fail the build."""
    from types import SimpleNamespace

    from granndis_hpc.preprocess.build.profile import write_profile

    phase_log = SimpleNamespace(rank=0, profile={"load": {}}, group=SimpleNamespace(gather_object=lambda p: [p]))
    write_profile(phase_log, str(tmp_path / "gone" / "profile.json"))
    assert "the shard set is complete, but its build profile could not be written to" in caplog.text
