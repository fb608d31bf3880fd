"""What a run's set-up would refuse after the world is up is refused right after the options are parsed
(cli.checked_before_start), before the topology exists and before any shard is read: `--model pyg` code that
cannot be imported, a shard set built for another job shape or layer count, a set the mode cannot use,
--mode auto's list without a set for this job.  One line, the refusal's exit status (1)."""
import pytest

from tests.unit.test_shards import build, make_graph

pytest.importorskip("mpi4py")


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("before_start")
    graph = make_graph(n=120, m=400, seed=5)
    build(graph, root / "1x1", servers=1, gpus_per_server=1, layers=2)
    build(graph, root / "2x2", servers=2, gpus_per_server=2, layers=2)
    return root


@pytest.fixture
def no_start_up(monkeypatch):
    """Fail the test if anything starts the world or reads a rank's shard rows."""
    from granndis_hpc import shards
    from granndis_hpc.cluster import topology
    from granndis_hpc.engine import trainer

    def started(*args, **kwargs):
        raise AssertionError("the world was started (or a shard read) before the refusal")

    for module, name in ((trainer, "init_topology"), (topology, "init_topology"), (shards, "read_rank_slice")):
        monkeypatch.setattr(module, name, started)
    monkeypatch.delenv("GRANNDIS_RANKS_PER_SERVER", raising=False)


def _refused(argv, match):
    from granndis_hpc import cli
    from granndis_hpc.cluster.errors import ClusterError

    with pytest.raises(ClusterError, match=match) as info:
        cli.checked_before_start(cli._parse_train_args(argv))
    assert "\n" not in str(info.value) and getattr(info.value, "exit_code", 1) == 1
    return str(info.value)


def test_model_code_that_cannot_be_imported(sets, no_start_up):
    base = ["--shards", str(sets / "1x1"), "--layers", "2", "--model", "pyg"]
    _refused(base + ["--model-option", "module=no_such_module_for_granndis"],
             r"ModelCodeError: --model pyg: no module named 'no_such_module_for_granndis' can be imported")
    pytest.importorskip("torch_geometric")
    _refused(base + ["--model-option", "module=json", "--model-option", "factory=no_such_factory"],
             r"module 'json' has no function 'no_such_factory'")


def test_a_set_built_for_another_job_shape(sets, no_start_up):
    _refused(["--shards", str(sets / "2x2"), "--ranks-per-server", "1"],
             r"built for 2 servers x 2 GPUs per server but this job runs 1 servers x 1 GPUs per server")
    _refused(["--shards", str(sets / "2x2")], r"\(4 ranks\) but this job runs 1 ranks")  # servers from the nodes


def test_more_layers_than_the_set_was_built_for(sets, no_start_up):
    _refused(["--shards", str(sets / "1x1"), "--mode", "flx", "--layers", "3"],
             r"built for a 2-layer model but this job trains 3 layers")


def test_auto_without_a_set_for_this_job(sets, no_start_up):
    _refused(["--shards", f"{sets / '2x2'},{sets / '2x2'}", "--mode", "auto", "--memory-per-gpu", "1GiB",
              "--ranks-per-server", "1"], r"--mode auto: none of the shard sets can run this job")


def test_a_resumed_run_is_checked_with_the_run_s_options(sets, tmp_path, no_start_up):
    import json

    from granndis_hpc.options.train import TrainConfig

    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig(shards=str(sets / "1x1"), mode="flx", layers=3, out=str(run))
    (run / "config.json").write_text(json.dumps(vars(cfg)))
    _refused(["--resume", str(run)], r"built for a 2-layer model but this job trains 3 layers")


def test_a_job_that_fits_passes(sets, no_start_up):
    from granndis_hpc import cli

    ns = cli.checked_before_start(cli._parse_train_args(["--shards", str(sets / "1x1"), "--mode", "flx",
                                                          "--layers", "2"]))
    assert ns.layers == 2


class _Started(Exception):
    pass


@pytest.fixture
def predict_start_up(monkeypatch):
    """predict's start-up raises _Started: what happened before it is what the test looks at."""
    from granndis_hpc.engine import predict

    def started(*args, **kwargs):
        raise _Started()

    monkeypatch.setattr(predict, "init_topology", started)


def test_predict_creates_its_output_directory_before_start_up(sets, tmp_path, predict_start_up):
    from granndis_hpc import cli

    out = tmp_path / "missing" / "deeper" / "preds.h5"
    with pytest.raises(_Started):
        cli.run_predict(["--model", str(tmp_path / "run"), "--shards", str(sets / "1x1"), "--out", str(out)])
    assert out.parent.is_dir() and not out.exists()


def test_predict_refuses_its_output_place_and_shards_before_start_up(sets, tmp_path, predict_start_up):
    from granndis_hpc import cli
    from granndis_hpc.cluster.errors import ClusterError

    taken = tmp_path / "notes.h5"
    taken.write_text("not predict's")
    base = ["--model", str(tmp_path / "run")]
    with pytest.raises(ClusterError, match=r"OutputError: refusing --out .*notes\.h5") as info:
        cli.run_predict(base + ["--shards", str(sets / "1x1"), "--out", str(taken)])
    assert "\n" not in str(info.value)
    with pytest.raises(ClusterError, match=r"ShardError: shard directory .*absent.* does not exist"):
        cli.run_predict(base + ["--shards", str(tmp_path / "absent"), "--out", str(tmp_path / "p.h5")])
    assert not (tmp_path / "p.h5").exists()
