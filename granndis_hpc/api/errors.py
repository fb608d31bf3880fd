"""The Python API's errors: one documented type, raised with the same one-line message on every rank.

An MPI job whose ranks disagree about an error hangs: the ranks that saw none wait in the next
collective for the ones that stopped.  So every check the API makes runs inside `agreed(...)`, which
shares each rank's outcome (one small allgather) and raises the same `GranndisError` on every rank
when any rank failed; an error the engine already raised on every rank together (a collective
ClusterError) is passed on as a `GranndisError` without further communication.  Only an error that
one rank raised alone inside the engine cannot be agreed on (its peers are waiting elsewhere): with
more than one rank the job is then ended with MPI_Abort, as the command-line tools end it, after the
rank prints what happened.
"""
from __future__ import annotations

import contextlib
import sys


class GranndisError(RuntimeError):
    """What the Python API raises for anything that stops a build, a training run or a prediction.
    Every rank of the job raises it at the same point with the same one-line message (which names the
    ranks when only some of them failed); `collective` is always True (cluster.errors.main_guard reads
    it); the original exception, where there was one on this rank, is its `__cause__`."""

    collective = True
    exit_code = 1


class OptionError(GranndisError, ValueError):
    """An option the API does not know (the message lists the close matches) or a value its declaration
    refuses (the same rules as the command line's)."""


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line: its first line, with the exception type where it adds anything."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, GranndisError) else f"{type(exc).__name__}: {text}"


def _group():
    from granndis_hpc.cluster import as_group

    return as_group(None)


def _message(reports: list, size: int) -> tuple:
    """(the agreed message, whether any rank raised an OptionError) from every rank's report."""
    bad = [(rank, msg, opt) for rank, (msg, opt) in enumerate(reports) if msg is not None]
    by_message: dict = {}
    for rank, msg, _ in bad:
        by_message.setdefault(msg, []).append(rank)
    parts = []
    for msg, ranks in by_message.items():
        if len(ranks) == size:  # every rank said the same: no rank list needed
            parts.append(msg)
        else:
            who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
            parts.append(f"{who}: {msg}")
    return "; ".join(parts), any(opt for _, _, opt in bad)


@contextlib.contextmanager
def agreed(what: str = ""):
    """Collective over MPI.COMM_WORLD: run the block on every rank, then raise the same GranndisError
    (OptionError when a rank's error was one) on every rank if the block raised on any.  `what` prefixes
    the message of any other exception ("build(): ValueError: ..."); a GranndisError's message says
    where it came from already."""
    error, cause = None, None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 -- shared with the other ranks below
        cause = exc
        text = one_line(exc)
        if what and not isinstance(exc, GranndisError):
            text = f"{what}: {text}"
        error = (text, isinstance(exc, OptionError))
    group = _group()
    reports = group.allgather_object((None, False) if error is None else error)
    if all(msg is None for msg, _ in reports):
        return
    message, option = _message(reports, group.size)
    cls = OptionError if option else GranndisError
    raise cls(message) from cause


def passed_on(exc: BaseException, what: str = "") -> BaseException:
    """The GranndisError to raise (from `exc`) for `exc`, which came out of the engine or the build: its
    message when every rank raised it together (a collective ClusterError) or the job has one rank;
    otherwise (one rank's own error, its peers waiting in a collective) the job is aborted."""
    if isinstance(exc, GranndisError):
        return exc
    collective = getattr(exc, "collective", False) is True
    group = _group()
    if collective or group.size == 1:
        text = " ".join(str(exc).split()) if collective else one_line(exc)
        return GranndisError(f"{what}: {text}" if what else text)
    sys.stderr.write(f"[rank {group.rank}] {one_line(exc)} (raised on this rank only: ending the job, since the "
                     f"other ranks would wait for it)\n")
    sys.stderr.flush()
    group.mpi_comm.Abort(1)
    return exc  # not reached
