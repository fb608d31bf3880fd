"""Failing loudly instead of hanging.

In an MPI job, an exception on one rank leaves the other ranks blocked forever in the next
collective.  Two tools prevent that:

* `agree(comm, ok, message)` -- a collective check *before* collectives: every rank says whether
  its input is fine; if any rank is not, every rank raises the same `ClusterError` naming the
  offending rank(s).  Use it for validation whose outcome may differ between ranks (files, env,
  sizes read from disk).
* `collective_errors(comm, phase)` -- the same check around a block: an exception inside it on any
  rank becomes the same `ClusterError` on every rank.
* `main_guard(fn)` -- wraps an entry point.  An exception on any rank prints
  "[rank r] <Type>: message" to stderr and aborts the whole job with exit status 1.  When the
  exception came out of `agree` (so every rank raises it together, with one message naming every
  failing rank and what it said), rank 0 prints it once and the ranks synchronise and exit together
  (status 1, or the error's exit_code: 2 for option errors), so nothing is killed mid-print.
"""
from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager



class ClusterError(RuntimeError):
    """A configuration or communication error in the cluster layer.

    `collective=True` means every rank of the communicator raised this same error at the same
    point (it came out of `agree`), so the ranks can exit together without an abort.
    """

    def __init__(self, message: str, collective: bool = False, exit_code: int = 1):
        super().__init__(message)
        self.collective = collective
        self.exit_code = exit_code  # main_guard's exit status for a collective error (2: an option error)


def raised_everywhere(exc: BaseException) -> BaseException:
    """Mark `exc` as raised by every rank of the world at the same point (e.g. from a value every rank
    all-reduced, such as the loss), so main_guard ends the job with its one-line message on every rank
    and a synchronised exit instead of a traceback and MPI_ABORT.  Returns `exc` (raise it)."""
    setattr(exc, "collective", True)  # an attribute any exception may carry (read by main_guard)
    return exc


def mpi():
    """mpi4py.MPI, imported on first use: importing it starts MPI (MPI_Init, a second or more on a busy
    node), which commands that never communicate (`granndis --help`, `preprocess info`, `verify`) skip."""
    from mpi4py import MPI
    return MPI


def _started():
    """mpi4py.MPI when MPI runs in this process (started and not finalised), else None; starts nothing."""
    MPI = sys.modules.get("mpi4py.MPI")
    return MPI if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() else None


def world_rank() -> int:
    MPI = _started()
    return MPI.COMM_WORLD.Get_rank() if MPI is not None else 0


def _abort(code: int) -> None:
    """End every rank with `code` (MPI_Abort); a process that never started MPI just exits."""
    MPI = _started()
    if MPI is None:
        sys.exit(code)
    MPI.COMM_WORLD.Abort(code)


def _mpi_comm(comm):
    """The mpi4py communicator behind `comm`: an mpi4py communicator itself, a Topology (its world)
    or a cluster.Group (anything with `mpi_comm`)."""
    if isinstance(comm, mpi().Comm):
        return comm
    inner = getattr(comm, "mpi_comm", None)
    if inner is None:
        raise TypeError(f"expected an MPI communicator, a Topology or a cluster.Group, got {type(comm).__name__}")
    return inner


def agree(comm, ok: bool, message: str = "") -> None:
    """Collective: raise the same ClusterError on every rank of `comm` if any rank passes ok=False.

    The error names each failing rank (its rank in MPI.COMM_WORLD) with the message it gave, so a
    user sees what is wrong wherever it went wrong.  Costs one small allgather.
    `comm`: an mpi4py communicator, a Topology (its world) or a cluster.Group.
    """
    comm = _mpi_comm(comm)
    reports = comm.allgather((bool(ok), world_rank(), str(message)))
    bad = [(rank, msg) for good, rank, msg in reports if not good]
    if not bad:
        return
    # Identical messages from many ranks (the usual case for a bad configuration) are shown once.
    by_message: dict[str, list[int]] = {}
    for rank, msg in bad:
        by_message.setdefault(msg, []).append(rank)
    parts = []
    for msg, ranks in by_message.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
        parts.append(f"{who}: {msg or 'reported a problem'}")
    # "collective" lets main_guard exit without an abort; that is only safe when every rank of the
    # job raised it, i.e. when `comm` spans the whole world.
    spans_world = comm.Get_size() == mpi().COMM_WORLD.Get_size()
    raise ClusterError("; ".join(parts), collective=spans_world)


@contextmanager
def collective_errors(comm, phase: str, catch=(Exception,), *, passthrough_alone: bool = False):
    """Collective: run the block on every rank, then agree on the outcome.

    An exception of a type in `catch` raised inside the block on any rank becomes the same
    ClusterError on every rank of `comm` (naming the rank(s) and `phase`; on a failing rank it is
    chained to the original exception); a block that succeeds everywhere costs one small allgather.
    Replaces the try / error text / agree pattern::

        with collective_errors(topo.world, "reading the shards"):
            manifest = read_manifest(path)

    `comm`: an mpi4py communicator, a Topology (its world) or a cluster.Group.
    passthrough_alone=True: on a one-rank communicator the exception propagates unchanged (no peer
    waits for it; in-process callers keep its type).  Exceptions not in `catch` propagate on their
    rank only (main_guard then aborts the job).
    """
    if passthrough_alone and _mpi_comm(comm).Get_size() == 1:
        yield
        return
    error, caught = "", None
    try:
        yield
    except catch as exc:  # noqa: BLE001 -- reported collectively below
        caught = exc
        error = f"{phase}: {type(exc).__name__}: {exc}" if phase else f"{type(exc).__name__}: {exc}"
    try:
        agree(comm, not error, error)
    except ClusterError as agreed:
        if caught is None:
            raise
        raise agreed from caught


def _report(exc: BaseException, rank: int, with_traceback: bool) -> None:
    if with_traceback:
        # The traceback without its last line: the one-line summary below states the exception.
        text = "Traceback (most recent call last):\n" + "".join(traceback.format_tb(exc.__traceback__))
        sys.stderr.write("".join(f"[rank {rank}] {line}" for line in text.splitlines(True)))
    sys.stderr.write(f"[rank {rank}] {type(exc).__name__}: {exc}\n")
    sys.stderr.flush()
    sys.stdout.flush()


def main_guard(fn, *args, **kwargs):
    """Run fn(*args, **kwargs); on an exception on any rank, make every rank exit non-zero.

    * collective ClusterError (from `agree`, or an error marked by raised_everywhere): rank 0 prints
      "[rank 0] ClusterError: ..." (the same message every rank holds), every rank waits at a barrier
      and exits with the error's exit_code (1; 2 for option errors).
    * anything else (including SystemExit with a non-zero code, e.g. argparse): the rank prints
      its traceback and "[rank r] <Type>: message" and calls MPI.COMM_WORLD.Abort(1), which
      terminates every rank (the others may be blocked in a collective).
    SystemExit(0) / None passes through unchanged.
    """
    try:
        return fn(*args, **kwargs)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        code = exc.code if isinstance(exc.code, int) else 1
        rank = world_rank()
        if not isinstance(exc.code, int):
            sys.stderr.write(f"[rank {rank}] error: {exc.code}\n")
        sys.stderr.write(f"[rank {rank}] exiting with status {code}; aborting all ranks\n")
        sys.stderr.flush()
        _abort(code)
    except BaseException as exc:  # noqa: BLE001 -- anything uncaught must not leave peers hanging
        rank = world_rank()
        if getattr(exc, "collective", False) is True:  # a ClusterError from agree, or raised_everywhere
            # Every rank holds the same message (agree names each failing rank and what it said), so
            # rank 0 says it once instead of every rank repeating it.
            if rank == 0:
                _report(exc, rank, with_traceback=False)
            try:
                if _started() is not None:
                    _started().COMM_WORLD.Barrier()
            finally:
                sys.exit(int(getattr(exc, "exit_code", 1) or 1))
        _report(exc, rank, with_traceback=True)
        _abort(1)
