"""What a command may write over: its own earlier output, and nothing else.

Every command that writes to a place a user names (predict's and build's --out, train's run directory,
chunk's and report's --out) checks that place here before it writes anything.  The place is refused, with
what is there, when it is

* a symbolic link (what would be replaced is the link's target, which the user did not name),
* anything but a file or a directory (a device such as /dev/null, a pipe, a socket),
* a place that holds something: without the overwrite option (--overwrite, --overwrite-run) always; with
  it when what is there was not written by the same command (recognised by the file the command writes
  there: a shard set's manifest.json, predict's provenance, a run's config.json, a report's report.md),
  when it is or holds what the command reads (the model's run directory, the shard set), or when it is the
  current directory or one above it.

An absent place, or an existing directory with nothing in it, is always usable.  Two shapes of output:
a *whole* output (a predict file or directory, a shard set, a chunked dataset) is everything in the place;
a *members* output (a run, a report) is a few named files inside a directory that may hold other things,
and only those are replaced.  The commands themselves write atomically (a temporary sibling renamed into
place, the old output deleted only once the new one is complete).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple


class OutputRefused(ValueError):
    """The place named for a command's output may not be written."""


@dataclass(frozen=True)
class OutputKind:
    """One command's output: who writes it, how it is recognised, what counts as its content."""
    tool: str                           # the command, e.g. "granndis predict"
    what: str                           # what it writes, e.g. "a shard set"
    recognise: Callable[[str], bool]    # True when the place holds this command's output
    option: str = "--out"               # the option that names the place
    overwrite: str = "--overwrite"      # the option that allows replacing it ("": the command has none)
    members: Tuple[str, ...] = ()       # a members output: the names it writes (and replaces) in the directory
    own: Callable[[str], bool] = lambda name: True       # a whole directory output: the names it writes
    ignored: Callable[[str], bool] = lambda name: False  # entries that are not content (never touched)
    existing: Optional[Callable[[str, List[str]], str]] = None  # the refusal of a place in use, without overwrite


def _kind_of_file(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _within(path: str, place: str) -> bool:
    """Whether `path` is `place` or lies inside it (symbolic links resolved)."""
    path, place = os.path.realpath(path), os.path.realpath(place)
    return path == place or path.startswith(place.rstrip(os.sep) + os.sep)


def _shown(names: Sequence[str], limit: int = 5) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def contents(path: str, kind: OutputKind) -> List[str]:
    """What the place holds that the command would replace: the file itself, a whole directory's entries,
    or the members present (an empty members directory, such as a run's checkpoints/, does not count)."""
    if not os.path.isdir(path):
        return [os.path.basename(path.rstrip(os.sep)) or path]
    if kind.members:
        return [m for m in kind.members if os.path.lexists(os.path.join(path, m))
                and not (os.path.isdir(os.path.join(path, m)) and not os.listdir(os.path.join(path, m)))]
    return [e for e in os.listdir(path) if not kind.ignored(e)]


def check_place_type(path: str, kind: OutputKind, error=OutputRefused) -> bool:
    """The first half of check_output_place, which looks at nothing inside the place: refuse a link, a device
    (or a file where a directory is written); return whether the place exists."""
    where = f"{kind.option} {path}"
    if os.path.islink(path):
        raise error(f"{where} is a symbolic link (to {os.readlink(path)}); {kind.tool} writes only where "
                    f"{kind.option} itself names, never a link's target: give the target's own path")
    if not os.path.lexists(path):
        return False
    mode = os.lstat(path).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise error(f"{where} is a {_kind_of_file(mode)}, not a file or directory {kind.tool} can write; "
                    f"choose another {kind.option}")
    if kind.members and not stat.S_ISDIR(mode):
        raise error(f"{where} is a file, not a directory: {kind.tool} writes a directory there; choose another "
                    f"{kind.option}")
    return True


def check_output_place(path, kind: OutputKind, overwrite: bool, reads: Iterable[Tuple[Optional[str], str]] = (),
                       error=OutputRefused) -> bool:
    """Refuse (raise `error`, one line saying what is there) a place `kind`'s command may not write; return
    whether it holds an earlier output of the command that will be replaced (overwrite given).  `reads`:
    (path, option) of what the command reads, never replaced (None: not given)."""
    path = os.fspath(path)
    where = f"{kind.option} {path}"
    if not check_place_type(path, kind, error):
        return False
    try:
        present = contents(path, kind)
    except OSError as exc:
        raise error(f"{where} cannot be read ({exc.strerror or exc}), so what it holds is unknown; fix its "
                    f"permissions or choose another {kind.option}") from None
    if not present:
        return False
    if not overwrite:
        raise error(_existing(path, kind, present))
    for read, option in reads:
        if read and _replaces(path, kind, present, read):
            raise error(f"{where} holds what {option} {read} reads: {kind.overwrite} never replaces what the "
                        f"command reads; choose another {kind.option}")
    cwd = _current_directory()
    if kind.overwrite and cwd and _within(cwd, path):
        raise error(f"{where} is the current directory (or holds it): {kind.overwrite} never replaces the "
                    f"directory a command runs in; run it from another directory, or choose another {kind.option}")
    foreign = [] if kind.members or not os.path.isdir(path) else [e for e in present if not kind.own(e)]
    if foreign or not kind.recognise(path):
        raise error(_foreign(path, kind, foreign or present))
    return True


def _replaces(path: str, kind: OutputKind, present: List[str], read: str) -> bool:
    """Whether replacing the place would replace `read`: it lies in the place (a whole output), or it is the
    directory or lies in one of the members present (a members output, whose other files stay)."""
    if not kind.members:
        return _within(read, path)
    return (os.path.realpath(read) == os.path.realpath(path)
            or any(_within(read, os.path.join(path, m)) for m in present))


def _current_directory() -> str:
    try:
        return os.getcwd()
    except OSError:  # removed since the command started: nothing to protect
        return ""


def _existing(path: str, kind: OutputKind, present: List[str]) -> str:
    if kind.existing is not None:
        return kind.existing(path, present)
    if not kind.overwrite:
        return (f"{kind.option} {path} {_held(path, present)}: {kind.tool} writes only to a path that does not exist "
                f"or an empty directory; choose another {kind.option}, or delete it first")
    if not kind.recognise(path):
        return _foreign(path, kind, present)
    return (f"{kind.option} {path} already exists and holds {kind.what} ({_shown(present)}); give {kind.overwrite} to "
            f"replace it, or choose another {kind.option}")


def _held(path: str, names: List[str]) -> str:
    return "is a file" if not os.path.isdir(path) else f"holds {_shown(names)}"


def _foreign(path: str, kind: OutputKind, names: List[str]) -> str:
    return (f"refusing {kind.option} {path}: it {_held(path, names)}, not {kind.what} written by {kind.tool}, the "
            f"only thing {kind.tool} replaces; choose another {kind.option}, or move that away yourself")
