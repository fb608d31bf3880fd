"""tests/unit is serial: none of its tests starts mpirun or a Slurm job (those live in tests/launch, which
`make test` runs one job at a time, and tests/mpi, which runs under mpirun itself)."""
import re
from pathlib import Path

UNIT = Path(__file__).resolve().parent
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
