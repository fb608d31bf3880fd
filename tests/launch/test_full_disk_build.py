"""A build that fills the disk: at every fill level and at every write (server files, the manifest), the
one-line error and exit 1, no temporary left, the old set intact; a server file's reserved estimate
covers its real size.  The free-space checks before the writes are switched off in these runs, as a
second writer filling the disk after them would: the space reservation before HDF5 writes is what
must keep HDF5 from meeting a full disk (it crashed, exit 139, in its file close)."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, mounted_tmpfs

BUILD = ["build", "--source", "synthetic", "--vertices", "3000", "--seed", "0", "--servers", "2",
         "--gpus-per-server", "1", "--layers", "1", "--partitioner", "random"]


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs (needs root, as CI and this machine run); unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (make test runs as root in CI)")
    with mounted_tmpfs(tmp_path / "fs", "16m") as mnt:
        yield mnt


# One interpreter for every fill level (the imports once); prints one line per outcome.
SCRIPT = r"""
import errno, json, os, sys, contextlib, io
import granndis_hpc.shards.writer as w
import granndis_hpc.preprocess.build.pipeline as b
import granndis_hpc.preprocess.build.distributed as d
from granndis_hpc.preprocess.__main__ import main
from granndis_hpc.preprocess.verify.command import verify_shard_set

mnt, out, build = sys.argv[1], sys.argv[2], sys.argv[3:]
old_build = [a if not (a == "2" and build[i - 1] == "--servers") else "1" for i, a in enumerate(build)]
w.check_free_space = b.check_free_space = lambda *a, **k: None   # a second writer fills the disk after them
reserved = {}
real_stage, real_estimate = w.stage_server_file, w.estimate_file_bytes
def estimate(arrays):
    reserved["last"] = real_estimate(arrays)
    return reserved["last"]
def stage(*args, **kw):  # every file written fits its estimate, the space reserved for it
    staged = real_stage(*args, **kw)
    assert staged.bytes <= reserved["last"], ("estimate short", staged.bytes, reserved["last"])
    return staged
w.estimate_file_bytes, w.stage_server_file = estimate, stage
b.stage_server_file = d.stage_server_file = stage

def snapshot():
    return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))}

def run(args=build, to=out):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(args + ["--out", to, "--overwrite"])
    return rc, err.getvalue().strip()

def fill(free_bytes):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(mnt, "filler"))
    st = os.statvfs(mnt)
    with open(os.path.join(mnt, "filler"), "wb") as f:
        f.write(b"\0" * max(st.f_bavail * st.f_frsize - free_bytes, 0))

# The size of the new set (two server files) on this file system, then the old set (one file).
probe = os.path.join(mnt, "probe")
rc, err = run(build, probe)
assert rc == 0, err
size = sum(os.path.getsize(os.path.join(probe, n)) for n in os.listdir(probe))
for n in os.listdir(probe):
    os.unlink(os.path.join(probe, n))
rc, err = run(old_build)
assert rc == 0, err
old = snapshot()
for level in (0.05, 0.3, 0.6, 0.9):
    fill(int(level * size))
    rc, err = run()
    leftovers = [n for n in os.listdir(out) if n.startswith(".")]
    print(f"level {level}: rc {rc} lines {len(err.splitlines())} tmp {leftovers} old {snapshot() == old} | {err}")
    assert rc == 1 and len(err.splitlines()) == 1 and "No space left on device" in err and not leftovers, err
    assert snapshot() == old and verify_shard_set(out) == []
os.unlink(os.path.join(mnt, "filler"))

# The manifest's write meets the full disk: the old set stays whole.
real_fsync = os.fsync
def fsync(fd):
    if ".manifest.json." in os.readlink(f"/proc/self/fd/{fd}"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real_fsync(fd)
w.os.fsync = fsync
rc, err = run()
w.os.fsync = real_fsync
leftovers = [n for n in os.listdir(out) if n.startswith(".")]
print(f"manifest: rc {rc} tmp {leftovers} old {snapshot() == old} | {err}")
assert rc == 1 and len(err.splitlines()) == 1 and "manifest.json (No space left on device)" in err, err
assert not leftovers and snapshot() == old and verify_shard_set(out) == []
# With room for the new set (the old one is replaced only at the commit) the build succeeds.
fill(2 * size)
rc, err = run()
print(f"level 2.0: rc {rc} | {err}")
assert rc == 0 and verify_shard_set(out) == [] and len(os.listdir(out)) == 3, err
print("OK")
"""


def test_a_build_filling_the_disk_at_any_point_exits_1_and_keeps_the_old_set(small_fs):
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(small_fs), str(small_fs / "set"), *BUILD], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), (res.returncode, res.stdout, res.stderr[-3000:])


def test_two_ranks_writing_at_once_onto_a_full_disk_stop_together_with_one_message(small_fs):
    """The whole-graph build writes its server files from both ranks at once: they race for the space."""
    from granndis_hpc.preprocess.__main__ import main
    from granndis_hpc.preprocess.verify.command import verify_shard_set
    from tests.conftest import run_mpi

    out, probe = small_fs / "set", small_fs / "probe"
    new = BUILD + ["--whole-graph"]
    assert main(new + ["--out", str(probe)]) == 0
    size = sum(os.path.getsize(probe / n) for n in os.listdir(probe))
    shutil.rmtree(probe)
    assert main([a if not (a == "2" and new[i - 1] == "--servers") else "1" for i, a in enumerate(new)]
                + ["--out", str(out)]) == 0
    old = {n: (out / n).read_bytes() for n in os.listdir(out)}
    st = os.statvfs(small_fs)
    (small_fs / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - size // 2))
    code = ("import sys, granndis_hpc.shards.writer as w, granndis_hpc.preprocess.build.pipeline as b; "
            "w.check_free_space = b.check_free_space = lambda *a, **k: None; "
            "from granndis_hpc.preprocess.__main__ import main; sys.exit(main(sys.argv[1:]))")
    r = run_mpi(["-c", code, *new, "--out", out, "--overwrite"], n=2, timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.count("preprocess build: error") == 1 and "No space left on device" in r.stderr, r.stderr
    assert "not enough free space in" in r.stderr and "needs about" in r.stderr, r.stderr  # not HDF5's words
    assert "Traceback" not in r.stderr and not [n for n in os.listdir(out) if n.startswith(".")]
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == old and verify_shard_set(out) == []
