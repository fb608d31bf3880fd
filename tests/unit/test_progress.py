"""Progress bar visibility rules and rank-labelled logging."""
import io
import logging
import warnings

import pytest

from granndis_hpc.progress import progress, progress_enabled, setup_logging


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.captureWarnings(False)


@pytest.mark.parametrize("rank, quiet, enabled, tty, shown", [
    (0, False, None, True, True),     # the normal interactive case
    (0, False, None, False, False),   # batch log file: no carriage-return junk
    (1, False, None, True, False),    # only rank 0 draws
    (0, True, None, True, False),     # --quiet
    (0, False, True, False, True),    # forced on
    (3, False, True, True, False),    # forcing never makes other ranks draw
    (0, False, False, True, False),   # forced off
])
def test_bar_drawn_only_on_rank0_terminal_not_quiet(rank, quiet, enabled, tty, shown):
    stream = FakeTerminal() if tty else io.StringIO()
    assert progress_enabled(rank, quiet, enabled, stream) is shown
    items = list(progress(range(7), desc="epochs", enabled=enabled, rank=rank, quiet=quiet, stream=stream))
    assert items == list(range(7))  # iterates the same whether drawn or not
    text = stream.getvalue()
    assert (("epochs" in text and "7/7" in text) if shown else text == ""), repr(text)


def test_manual_bar_with_total():
    stream = FakeTerminal()
    with progress(10, desc="batches", stream=stream) as bar:
        for _ in range(4):
            bar.update(2)
        bar.update(2)
    assert "10/10" in stream.getvalue()
    hidden = io.StringIO()
    with progress(10, desc="batches", rank=2, stream=hidden) as bar:
        bar.update(10)
    assert hidden.getvalue() == ""
    with pytest.raises(ValueError, match=">= 0"):
        progress(-1)


def test_closed_or_plain_streams_count_as_not_a_terminal():
    closed = io.StringIO()
    closed.close()
    assert progress_enabled(0, False, None, closed) is False
    assert progress_enabled(0, False, None, object()) is False


def test_log_lines_carry_rank_and_level(restore_root_logger):
    out = io.StringIO()
    log = setup_logging(3, stream=out)
    log.info("routine")                       # rank 3: not shown by default
    logging.getLogger("granndis_hpc.engine").warning("slow link")
    assert out.getvalue() == "[rank 3] WARNING: slow link\n"

    out0 = io.StringIO()
    setup_logging(0, stream=out0)             # calling again replaces the handler (no duplicates)
    log.info("epoch %d done", 5)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    lines = out0.getvalue().splitlines()
    assert lines[0] == "[rank 0] epoch 5 done"
    assert lines[1] == "[rank 0] ERROR: failed"
    assert all(line.startswith("[rank 0] ERROR: ") for line in lines[2:]) and "RuntimeError: boom" in lines[-1]
    assert out.getvalue() == "[rank 3] WARNING: slow link\n"  # old handler is gone


def test_quiet_all_ranks_and_python_warnings(restore_root_logger):
    out = io.StringIO()
    log = setup_logging(0, quiet=True, stream=out)
    log.info("hidden")
    log.warning("shown")
    assert out.getvalue() == "[rank 0] WARNING: shown\n"

    out = io.StringIO()
    log = setup_logging(2, all_ranks=True, stream=out)
    log.info("every rank talks")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[rank 2] every rank talks"
    assert lines[1].startswith("[rank 2] WARNING: ") and "deprecated thing" in lines[1]


def test_log_line_does_not_tear_an_active_bar(restore_root_logger):
    term = FakeTerminal()
    log = setup_logging(0, stream=term)
    with progress(3, desc="epochs", stream=term) as bar:
        bar.update(1)
        log.info("checkpoint written")
        bar.update(2)
    text = term.getvalue()
    # the message is on a line of its own (tqdm.write clears the bar before writing it)
    assert "\n[rank 0] checkpoint written\n" in text.replace("\r", "\n")
