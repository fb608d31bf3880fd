"""tests/unit is serial: none of its tests starts mpirun or a Slurm job (those live in tests/launch, which
`make test` runs one job at a time, and tests/mpi, which runs under mpirun itself); and no tracked source
or page is longer than MAX_LINES.  The guide is one concern per module, test file or page, which keeps
them near 400 lines (docs/architecture.md, "Conventions"); MAX_LINES is the ceiling past which a file
has certainly grown a second concern, not a length to fill."""
import re
import subprocess
from pathlib import Path

UNIT = Path(__file__).resolve().parent
REPO = UNIT.parents[1]
MAX_LINES = 500
LAUNCHES = re.compile(r"\b(?:run_mpi|start_mpi|mpi_command)\(|\bsr\.(?:submit|slurm_cluster)\(")


def launches(text: str) -> list:
    return [line.strip() for line in text.splitlines() if LAUNCHES.search(line) and not line.lstrip().startswith("#")]


def test_no_unit_test_starts_mpirun():
    found = {p.name: launches(p.read_text()) for p in sorted(UNIT.glob("test_*.py")) if p.name != Path(__file__).name}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"move these tests to tests/launch/: {found}"


def test_the_check_sees_a_launch():
    assert launches("    res = run_mpi(['-m', 'x'], n=2)\n") and launches("    with sr.slurm_cluster():\n")
    assert not launches("    # run_mpi(...) in tests/launch\n    assert cmd[:2] == ['mpirun', '-n']\n")


def too_long(root: Path = REPO) -> dict:
    out = subprocess.run(["git", "ls-files", "-z", "*.py", "*.md"], cwd=root, capture_output=True, check=True).stdout
    lengths = {}
    for name in out.decode().split("\0"):
        path = root / name
        if name and path.is_file():
            lengths[name] = path.read_bytes().count(b"\n")
    return {name: n for name, n in lengths.items() if n > MAX_LINES}


def test_no_tracked_file_is_longer_than_the_limit():
    long = too_long()
    assert not long, f"split these by concern (at most {MAX_LINES} lines each): {long}"


def test_no_tracked_source_or_page_holds_a_nul_byte():
    # A NUL (an MPI library's version string ends with one) makes grep and git treat a page as binary.
    out = subprocess.run(["git", "ls-files", "-z", "*.py", "*.md"], cwd=REPO, capture_output=True, check=True).stdout
    found = [n for n in out.decode().split("\0") if n and (REPO / n).is_file() and b"\0" in (REPO / n).read_bytes()]
    assert not found, f"NUL bytes in {found}"


def test_the_length_check_sees_a_long_file(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.md").write_text("line\n" * MAX_LINES)
    subprocess.run(["git", "add", "long.py", "short.md"], cwd=tmp_path, check=True)
    assert too_long(tmp_path) == {"long.py": MAX_LINES + 1}
