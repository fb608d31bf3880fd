"""The package as a site installs it: the wheel built from this checkout, installed into a fresh virtual
environment, holds one top-level package with the C kernels compiled in, and trains a 2 x 2 shard set
under mpirun with no C compiler on PATH, using those kernels (summary.json's compute says so)."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, mpi_command, mpi_env, require_planetoid

COMPILERS = ("cc", "c89", "c99", "gcc", "g++", "c++", "clang", "clang++", "tcc", "icx", "icc")


def _run(cmd, timeout, **kwargs):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert res.returncode == 0, f"{cmd}: {res.stdout}{res.stderr}"
    return res


def _is_compiler(name: str) -> bool:
    base = name.split("-")[-1] if name.startswith(("x86_64-", "aarch64-")) else name
    return base in COMPILERS or base.startswith(("gcc-", "g++-", "clang-", "cc-"))


def _path_without_compilers(tmp_path: Path) -> str:
    """A PATH of one folder linking every program on today's PATH but C and C++ compilers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = os.path.join(folder, name)
            if not _is_compiler(name) and not (bin_dir / name).exists() and os.access(target, os.X_OK):
                (bin_dir / name).symlink_to(target)
    return str(bin_dir)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel of a copy of the checkout (a build writes build/ and *.egg-info beside its sources)."""
    out = tmp_path_factory.mktemp("wheel")
    tracked = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], timeout=60,
                   cwd=REPO).stdout.split("\0")
    source = out / "source"
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source],
         timeout=600, cwd=out)
    (path,) = out.glob("granndis_hpc-*.whl")
    return path


def test_the_wheel_holds_one_package_with_its_kernels(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"granndis_hpc"}, top
    assert any(n.startswith("granndis_hpc/nn/_cpu_kernels") and n.endswith(".so") for n in names)
    assert "granndis_hpc/preprocess/build/pipeline.py" in names
    assert "granndis_hpc/configs/products.toml" in names  # the presets: --config products anywhere
    assert not any(n.endswith((".c", ".h")) for n in names), "sources belong in the sdist, not the wheel"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = [line.split("=")[0].strip() for line in zipfile.ZipFile(wheel).read(entry).decode().splitlines()
               if "=" in line]
    assert sorted(scripts) == ["granndis", "granndis-train"]


@pytest.mark.timeout(900)
def test_installed_wheel_trains_with_its_kernels_and_no_compiler(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
         timeout=300)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     timeout=60).stdout.strip())
    ours = sorted(p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth"))
                  and p.name not in ("__pycache__", "_distutils_hack", "pip", "setuptools", "pkg_resources"))
    assert ours == ["granndis_hpc"], ours
    # The dependencies (torch, mpi4py, h5py, ...) from this test's environment, read as a plain folder: its
    # .pth files (this checkout's editable install among them) are not processed.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    shards = tmp_path / "shards"
    _run([sys.executable, "-m", "granndis_hpc.preprocess", "build", "--source", "planetoid", "--name", "cora",
          "--root", require_planetoid(), "--servers", "2", "--gpus-per-server", "2", "--layers", "2",
          "--partitioner", "metis", "--out", shards], timeout=300, cwd=REPO, env=mpi_env())

    env = {k: v for k, v in mpi_env({"GRANNDIS_CPU_KERNELS": "native", "CC": ""}).items() if k != "PYTHONPATH"}
    env["PATH"] = _path_without_compilers(tmp_path)
    assert shutil.which("cc", path=env["PATH"]) is None and shutil.which("gcc", path=env["PATH"]) is None
    where = _run([python, "-c", "import granndis_hpc.nn.cpu_kernels as k; print(k.__file__); print(k.kernel_name())"],
                 timeout=120, cwd=tmp_path, env=env).stdout.split()
    assert where[0].startswith(str(site)) and where[1] == "native", where
    cmd = mpi_command(["-m", "granndis_hpc.cli", "train", "--shards", shards, "--ranks-per-server", "2",
                       "--mode", "fb", "--layers", "2", "--epochs", "2", "--quiet", "--out", tmp_path / "run"])
    cmd[cmd.index(sys.executable)] = str(python)
    _run(cmd, timeout=600, cwd=tmp_path, env=env)
    compute = json.loads((tmp_path / "run" / "summary.json").read_text())["compute"]
    assert compute["kernels"] == "native" and compute["kernel_dispatch"], compute
