"""The product logs through `logging`, per rank (--log-level, --log-all-ranks); only the commands print."""
import ast
import io
import logging
import pathlib

import pytest

from granndis_hpc.options.train import TrainConfig
from granndis_hpc.options.train_groups import LOG_LEVELS
from granndis_hpc.options import specs
from granndis_hpc.options.predict import PredictOptions
from granndis_hpc.progress import PRODUCT_LOGGERS, setup_logging
from granndis_hpc.preprocess.options import BuildOptions

REPO = pathlib.Path(__file__).resolve().parents[2]

# The modules whose print() is a command's own output (tables, `info`, `plan`, usage, the per-epoch
# lines and the run's layout on stdout, argparse-time messages before logging is set up).
COMMAND_OUTPUT = {
    "granndis_hpc/cli.py", "granndis_hpc/report/command.py", "granndis_hpc/options/reference.py",
    "granndis_hpc/options/parser.py", "granndis_hpc/cluster/selfcheck.py", "granndis_hpc/engine/trainer.py",
    "granndis_hpc/engine/run_report.py", "granndis_hpc/api/building.py", "granndis_hpc/api/prediction.py",
    "preprocess/__main__.py", "preprocess/plan/command.py",
}


def _prints(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_library_code_logs_instead_of_printing():
    found = {}
    for package in ("granndis_hpc", "preprocess"):
        for path in sorted((REPO / package).rglob("*.py")):
            name = path.relative_to(REPO).as_posix()
            if name not in COMMAND_OUTPUT and _prints(path):
                found[name] = _prints(path)
    assert not found, f"print() in library code (log through logging.getLogger(__name__)): {found}"


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in PRODUCT_LOGGERS})
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_log_level_and_all_ranks(restore_root_logger):
    lib = logging.getLogger("granndis_hpc.rundir.checkpoint_files")
    for rank, all_ranks, level, shown in [(0, False, "info", ["i", "w"]), (0, False, "warning", ["w"]),
                                          (2, False, "debug", ["w"]), (2, True, "debug", ["d", "i", "w"]),
                                          (1, True, "error", [])]:
        out = io.StringIO()
        setup_logging(rank, all_ranks=all_ranks, level=level, stream=out)
        lib.debug("d")
        lib.info("i")
        lib.warning("w")
        want = [f"[rank {rank}] " + ("WARNING: " if m == "w" else "") + m for m in shown]
        assert out.getvalue().splitlines() == want, (rank, all_ranks, level)


def test_every_command_that_logs_takes_the_same_options():
    for cls in (TrainConfig, PredictOptions, BuildOptions):
        by_name = {s.name: s for s in specs(cls)}
        assert by_name["log_level"].default == "info" and tuple(by_name["log_level"].meta["choices"]) == LOG_LEVELS
        assert by_name["log_all_ranks"].default is False


def test_other_libraries_log_only_warnings(restore_root_logger):
    out = io.StringIO()
    setup_logging(0, level="debug", stream=out)
    logging.getLogger("granndis_hpc.preprocess.build.pipeline").debug("ours")
    logging.getLogger("matplotlib.font_manager").debug("theirs")
    logging.getLogger("matplotlib.font_manager").info("theirs too")
    logging.getLogger("matplotlib.font_manager").warning("their warning")
    assert out.getvalue().splitlines() == ["[rank 0] ours", "[rank 0] WARNING: their warning"]
