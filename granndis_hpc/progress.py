"""Progress bars and log lines for MPI jobs, without importing MPI (the caller passes its rank in).

- A progress bar is drawn only by rank 0 (N ranks drawing into one terminal is noise), only when the
  stream is a terminal (batch logs under Slurm would fill with carriage-return junk), and never with
  --quiet.  When it is not drawn, `progress` still returns a working pass-through object, so callers
  write one code path.
- Log lines carry the rank: ``[rank 3] message`` (``[rank 3] WARNING: message`` above INFO).  By
  default rank 0 logs INFO and the other ranks only WARNING and above, so a 64-rank job prints each
  routine line once but every rank's problems still reach the user, labelled.  The commands set this
  up from their options --log-level and --log-all-ranks (`setup_logging`); library code logs through
  ``logging.getLogger(__name__)`` and prints nothing itself.
- Log lines go through ``tqdm.write`` so that they do not tear a progress bar in the same terminal.
"""
from __future__ import annotations

import logging
import sys

from tqdm import tqdm

__all__ = ["progress", "progress_enabled", "setup_logging", "RankFormatter", "TqdmHandler"]


def progress_enabled(rank: int = 0, quiet: bool = False, enabled: bool | None = None, stream=None) -> bool:
    """Whether a bar should be drawn: rank 0, not quiet, and (enabled, or stream is a terminal if None)."""
    if rank != 0 or quiet or enabled is False:
        return False
    if enabled is True:
        return True
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or file-like objects without isatty
        return False


def progress(iterable_or_total=None, desc: str | None = None, enabled: bool | None = None, *,
             rank: int = 0, quiet: bool = False, stream=None, **tqdm_kwargs) -> tqdm:
    """A tqdm bar over an iterable, or a manual bar of `total` steps (call ``.update(n)``).

    `enabled`: None = decide from the terminal; True = draw even when not a terminal; False = never.
    Rank != 0 and `quiet` always disable it.  The result is a tqdm object in every case (disabled tqdm
    objects iterate, update and close at no cost), usable as a context manager.
    """
    stream = sys.stderr if stream is None else stream
    show = progress_enabled(rank, quiet, enabled, stream)
    if isinstance(iterable_or_total, int) and not isinstance(iterable_or_total, bool):
        if iterable_or_total < 0:
            raise ValueError(f"progress total must be >= 0, got {iterable_or_total}")
        return tqdm(total=iterable_or_total, desc=desc, disable=not show, file=stream, **tqdm_kwargs)
    return tqdm(iterable_or_total, desc=desc, disable=not show, file=stream, **tqdm_kwargs)


class RankFormatter(logging.Formatter):
    """``[rank R] message`` for INFO and below, ``[rank R] LEVEL: message`` above."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)  # message plus any exception traceback
        level = "" if record.levelno <= logging.INFO else f"{record.levelname}: "
        return "\n".join(f"[rank {self.rank}] {level}{line}" for line in text.splitlines() or [""])


class TqdmHandler(logging.StreamHandler):
    """Writes through tqdm.write so an active bar is cleared and redrawn around the line."""

    def __init__(self, stream=None):
        super().__init__(stream)
        # No stream given: write to whatever sys.stderr is when a line is logged (a test's capture, or
        # the real one again after it), not to the object it was when logging was set up.
        self.follow_stderr = stream is None

    def emit(self, record: logging.LogRecord) -> None:
        if self.follow_stderr:
            self.stream = sys.stderr
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # logging must never kill the job; same policy as logging.StreamHandler
            self.handleError(record)


_HANDLER_TAG = "_granndis_rank_handler"
PRODUCT_LOGGERS = ("granndis_hpc",)


def setup_logging(rank: int, quiet: bool = False, *, all_ranks: bool = False,
                  level: int | str | None = None, stream=None) -> logging.Logger:
    """Configure the root logger for this rank; safe to call again (replaces only its own handler).

    `level` (a logging level or its name, as --log-level gives it; default INFO, WARNING when `quiet`)
    applies on rank 0, and on every rank when `all_ranks` (--log-all-ranks); the other ranks log
    WARNING and above, never less than `level`.  Python warnings are routed into logging too, so they also
    carry the rank.  Returns the "granndis_hpc" logger.
    """
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
    if level is None:
        level = logging.WARNING if quiet else logging.INFO
    if rank != 0 and not all_ranks:
        level = max(level, logging.WARNING)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_TAG, False)]:
        root.removeHandler(old)
    handler = TqdmHandler(stream)
    setattr(handler, _HANDLER_TAG, True)
    handler.setFormatter(RankFormatter(rank))
    root.addHandler(handler)
    # The product's loggers log at `level`; other libraries' (matplotlib, torch, ...) only from WARNING
    # up, so --log-level debug shows this program's debug lines, not theirs.
    root.setLevel(max(level, logging.WARNING))
    for name in PRODUCT_LOGGERS:
        logging.getLogger(name).setLevel(level)
    logging.captureWarnings(True)
    return logging.getLogger("granndis_hpc")
