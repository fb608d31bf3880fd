"""idx_t and real_t of METIS, ParMETIS and PT-Scotch are read from the loaded library
(preprocess/partition/native_types.py): checked against the installed headers and pymetis' own report,
against the environment, and against fake libraries of impossible or unknown widths; METIS is reached
through no private pymetis module (preprocess/partition/metis.py)."""
import ctypes
import json
import pathlib
import re
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from granndis_hpc.preprocess.partition import metis, native_types, parmetis
from granndis_hpc.preprocess.partition.native_types import PartitionerError
from tests.conftest import REPO, mpi_env

LIBDIR = pathlib.Path("/usr/lib") / (sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")
# Debian's PT-Scotch ParMETIS interface, both builds: (library, the folder its libptscotch comes from, header)
SCOTCH_BUILDS = {
    "int32": ("libparmetis.so", None, pathlib.Path("/usr/include/scotch/scotch.h")),
    "int64": (str(LIBDIR / "parmetis-int64" / "libparmetis.so"), str(LIBDIR / "scotch-int64"),
              pathlib.Path("/usr/include/scotch-int64/scotch.h")),
}
C_TYPE_BITS = {"int": 32, "int32_t": 32, "long": 64, "int64_t": 64, "long long": 64}

# In a fresh process (widths are read once per library load): the widths, and a PT-Scotch partition of a
# 200-vertex ring into 4 parts on this process alone, made with arrays of the width read.
PROBE = """
import json, numpy as np
from mpi4py import MPI
from granndis_hpc.preprocess.partition.metis import load_metis
from granndis_hpc.preprocess.partition.parmetis import load_parmetis, parmetis_part_kway
pm, n = load_parmetis(), 200
xadj = np.arange(0, 2 * n + 1, 2)
adjncy = np.stack([(np.arange(n) - 1) % n, (np.arange(n) + 1) % n], axis=1).reshape(-1)
parts = parmetis_part_kway(pm, MPI.COMM_SELF, np.array([0, n]), xadj, adjncy, 4, None, seed=1)
print(json.dumps({"idx": pm.idx_dtype.itemsize * 8, "real": pm.real_dtype.itemsize * 8,
                  "metis_idx": load_metis().idx_dtype.itemsize * 8, "sizes": np.bincount(parts).tolist()}))
"""


def probe_in_subprocess(env: dict) -> dict:
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=mpi_env(env), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def header_num_bits(header: pathlib.Path) -> int:
    """The width of SCOTCH_Num as scotch.h declares it."""
    match = re.search(r"^typedef\s+([\w ]+?)\s+SCOTCH_Num\s*;", header.read_text(), re.M)
    return C_TYPE_BITS[match.group(1)]


@pytest.mark.parametrize("build", sorted(SCOTCH_BUILDS))
def test_scotch_width_is_the_one_its_header_declares_and_partitions(build):
    library, libdir, header = SCOTCH_BUILDS[build]
    if not header.is_file() or (libdir and not pathlib.Path(libdir).is_dir()):
        pytest.skip(f"Debian's {build} PT-Scotch (libscotchparmetis-dev, `make setup`) is not installed")
    env = {"GRANNDIS_PARMETIS_LIB": library}
    if libdir:  # the loader would otherwise give this build's ParMETIS interface the default libptscotch
        env["LD_LIBRARY_PATH"] = libdir
    got = probe_in_subprocess(env)
    assert got["idx"] == header_num_bits(header) == int(build[3:])
    assert got["real"] == 32  # PT-Scotch's parmetis.h: float tpwgts and ubvec
    assert sum(got["sizes"]) == 200 and len(got["sizes"]) == 4 and min(got["sizes"]) >= 45, got


def test_metis_width_is_the_one_pymetis_was_built_with():
    import pymetis

    lib = metis.load_metis()
    assert lib is not None, "pymetis' folder holds no library exporting METIS' API"
    assert lib.idx_dtype == pymetis.zero_copy_dtype()  # pymetis' public report of its METIS' idx_t
    assert pathlib.Path(lib.path).parent == pathlib.Path(pymetis.__file__).parent


def test_metis_real_width_reads_targets_as_metis_does(capfd):
    """real_t from the probe, then the same METIS given targets {0.25, 0.75} in that width: a 400-vertex
    ring splits 100 / 300, so METIS read them as written.  The refused try prints nothing."""
    lib = metis.load_metis()
    bits = native_types.metis_real_bits(lib.lib, lib.path, lib.idx_dtype.itemsize * 8)
    assert capfd.readouterr().out == ""
    idx, n = lib.idx_dtype, 400
    xadj = np.arange(0, 2 * n + 1, 2, dtype=idx)
    adjncy = np.stack([(np.arange(n) - 1) % n, (np.arange(n) + 1) % n], axis=1).reshape(-1).astype(idx)
    scalar = [np.array([v], dtype=idx) for v in (n, 1, 2)]
    targets = np.array([0.25, 0.75], dtype=np.dtype(f"float{bits}"))
    objval, part = np.zeros(1, dtype=idx), np.zeros(n, dtype=idx)
    p = native_types.c_pointer
    rc = lib.lib.METIS_PartGraphRecursive(p(scalar[0]), p(scalar[1]), p(xadj), p(adjncy), None, None, None,
                                          p(scalar[2]), p(targets), None, None, p(objval), p(part))
    assert rc == native_types.METIS_OK
    assert abs(int(np.sum(part == 0)) - 100) <= 5, np.bincount(part)


def test_no_environment_variable_changes_a_width():
    plain = probe_in_subprocess({})
    other = {32: "64", 64: "32"}
    env = {name: other[plain["idx"]] for name in ("GRANNDIS_PARMETIS_IDXTYPEWIDTH", "IDXTYPEWIDTH",
                                                  "METIS_IDXTYPEWIDTH", "PARMETIS_IDXTYPEWIDTH")}
    env.update({name: other[plain["real"]] for name in ("GRANNDIS_PARMETIS_REALTYPEWIDTH", "REALTYPEWIDTH",
                                                        "METIS_REALTYPEWIDTH")})
    assert probe_in_subprocess(env) == plain


class FakeMetis:
    """A library whose METIS_SetDefaultOptions writes `idx_bytes` bytes of -1 for each of the 40 options and
    whose METIS_PartGraphRecursive reads targets as float`real_bits` (None: accepts any)."""

    def __init__(self, idx_bytes: int, real_bits, parmetis=False):
        self.idx_bytes, self.real_bits = idx_bytes, real_bits
        if parmetis:
            self.ParMETIS_V3_PartKway = lambda *args: native_types.METIS_OK

    def METIS_SetDefaultOptions(self, options):
        ctypes.memset(options.value, 0xFF, self.idx_bytes * native_types.METIS_NOPTIONS)
        return native_types.METIS_OK

    def METIS_PartGraphRecursive(self, *args):
        if self.real_bits is None:
            return native_types.METIS_OK
        real = ctypes.c_float if self.real_bits == 32 else ctypes.c_double
        targets = ctypes.cast(args[8], ctypes.POINTER(real))
        return native_types.METIS_OK if abs(targets[0] + targets[1] - 1) < 0.01 else -2


class FakeScotch:
    def __init__(self, num_bytes: int):
        self.SCOTCH_numSizeof = lambda: num_bytes


def assert_one_line(exc, *parts):
    message = str(exc.value)
    assert "\n" not in message and all(part in message for part in parts), message


def test_impossible_or_unknown_widths_are_refused_in_one_line():
    with pytest.raises(PartitionerError) as exc:
        native_types.metis_idx_bits(FakeMetis(2, 32), "fake.so")
    assert_one_line(exc, "fake.so", "idx_t", "16 bits", "32 or 64")
    with pytest.raises(PartitionerError) as exc:
        native_types.metis_idx_bits(FakeMetis(0, 32), "fake.so")
    assert_one_line(exc, "fake.so", "did not write 40 options", "METIS 5")
    with pytest.raises(PartitionerError) as exc:
        native_types.scotch_idx_bits(FakeScotch(2), "fake.so")
    assert_one_line(exc, "fake.so", "SCOTCH_Num", "16 bits", "32 or 64")
    with pytest.raises(PartitionerError) as exc:
        native_types.metis_real_bits(FakeMetis(8, None), "fake.so", 64)
    assert_one_line(exc, "fake.so", "float32 and float64", "real_t width is unknown")
    assert native_types.scotch_idx_bits(FakeScotch(8), "fake.so") == 64


@pytest.mark.parametrize("idx_bytes,real_bits", [(4, 32), (8, 64), (8, 32), (2, 32)])
def test_load_parmetis_reads_karypis_widths_from_the_library(monkeypatch, idx_bytes, real_bits):
    fake, real_cdll = FakeMetis(idx_bytes, real_bits, parmetis=True), ctypes.CDLL
    monkeypatch.setenv("GRANNDIS_PARMETIS_LIB", "fake-libparmetis.so")
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **k: fake if name == "fake-libparmetis.so"
                        else real_cdll(name, *a, **k))
    if idx_bytes == 2:
        with pytest.raises(PartitionerError) as exc:
            parmetis.load_parmetis()
        assert_one_line(exc, "fake-libparmetis.so", "16 bits")
        return
    pm = parmetis.load_parmetis()
    assert (pm.is_scotch, pm.idx_dtype, pm.real_dtype) == (False, np.dtype(f"int{8 * idx_bytes}"),
                                                            np.dtype(f"float{real_bits}"))


def test_without_a_metis_library_metis_part_uses_pymetis_api_with_one_constraint(tmp_path, monkeypatch):
    assert metis.find_metis(tmp_path) is None
    monkeypatch.setattr(metis, "load_metis", lambda: None)
    n = 60
    xadj = np.arange(0, 2 * n + 1, 2)
    adjncy = np.stack([(np.arange(n) - 1) % n, (np.arange(n) + 1) % n], axis=1).reshape(-1)
    parts, ncon = metis.metis_part(xadj, adjncy, 2, np.ones((n, 2), dtype=np.int64))
    assert ncon == 1 and sorted(np.bincount(parts).tolist()) == [30, 30]


PRIVATE_PYMETIS = re.compile(r"\bpymetis\._(?!_)\w+|\bfrom\s+pymetis\s+import\s+\(?\s*_|\b_idx_type_width\b")
RETIRED = re.compile(r"\bGRANNDIS_PARMETIS_(?:IDX|REAL)TYPEWIDTH\b")


SCANNED = (".py", ".md", ".sh", ".sbatch", ".toml", ".cfg", ".txt")


def scanned_files(root: pathlib.Path):
    """The repository's code, docs and scripts: every top-level entry but hidden ones and tests/."""
    for top in sorted(root.iterdir()):
        if top.name.startswith(".") or top.name == "tests":
            continue
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            if path.is_file() and (path.suffix in SCANNED or path.name == "Makefile"):
                yield path


def offenders(root: pathlib.Path) -> dict:
    """{file: what} for every private pymetis name in the code and every retired width variable anywhere."""
    found = {}
    for path in scanned_files(root):
        text = path.read_text(errors="replace")
        hits = RETIRED.findall(text) + (PRIVATE_PYMETIS.findall(text) if path.suffix == ".py" else [])
        if hits:
            found[path.relative_to(root).as_posix()] = sorted(set(hits))
    return found


def test_no_private_pymetis_name_nor_width_variable_remains():
    assert offenders(REPO) == {}


def test_the_scan_finds_planted_ones(tmp_path):
    (tmp_path / "preprocess").mkdir()
    (tmp_path / "preprocess" / "m.py").write_text("import pymetis._internal as internal\n")
    (tmp_path / "preprocess" / "n.py").write_text("from pymetis import _internal\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d.md").write_text("set GRANNDIS_PARMETIS_IDXTYPEWIDTH=64\n")
    assert offenders(tmp_path) == {"docs/d.md": ["GRANNDIS_PARMETIS_IDXTYPEWIDTH"],
                                   "preprocess/m.py": ["pymetis._internal"],
                                   "preprocess/n.py": ["from pymetis import _"]}
