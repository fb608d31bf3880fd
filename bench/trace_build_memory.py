"""Where a build rank's memory is during the partition phase (issue 17; a measurement tool, not a test).

  mpirun -n P python bench/trace_build_memory.py --trace OUT.json -- build --source synthetic ... --out DIR

runs `python -m preprocess build ...` on every rank with two probes and writes one JSON record per rank
(rank 0 gathers them into OUT.json):

* around every ParMETIS_V3_PartKway call (preprocess.partition.parmetis_part_kway): VmRSS just before
  the call, VmHWM of the call itself (reset with /proc/self/clear_refs just before) and VmRSS after,
  and the numpy arrays alive at the call, found by walking every Python frame's locals and the objects
  they hold (two levels of attributes and containers) and grouped by (function, name): what of that
  RSS is ours, the rest being the interpreter, MPI and the library's own;
* a sampler thread: VmRSS every --interval s, the largest sample of each stretch (before the first
  call, each call, after each call) kept with the main thread's Python stack at that moment; during a
  call also malloc's bytes in use (glibc mallinfo2), whose rise above the bytes in use at the call is
  the library's own allocations, whatever freed pages it reuses (VmRSS does not show that).

and, in the halos+write phase (preprocess/dist_server.py), a probe at the start of every server, after
its halo selection, its owner assignment and at every block round (`_Blocks.gather`): VmRSS, malloc's
bytes in use and the numpy arrays alive (the frames' locals, and what the server's streamed datasets'
closures and generators hold); per rank the record of the largest VmRSS is kept, with the sampler's
largest sample of the phase (`halos` in the samples).

The probes read /proc and mallinfo2 only (no tracemalloc: its bookkeeping would change the RSS).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


from preprocess.parmetis import libc_malloc_info  # noqa: E402  (after the sys.path line above)

_libc = libc_malloc_info()


def _count_buffer(v: np.ndarray, label: str, seen: set, out: dict) -> None:
    """Add v's data buffer (its base array's) to out[label], once per buffer over `seen`."""
    base = v
    while isinstance(base.base, np.ndarray):
        base = base.base
    key = base.__array_interface__["data"][0]
    if key not in seen and base.nbytes:
        seen.add(key)
        out[label] = out.get(label, 0) + base.nbytes


def heap_in_use() -> int:
    """malloc's bytes in use (glibc mallinfo2: arena chunks in use + mmapped chunks): unlike VmRSS, not
    inflated by freed pages malloc keeps, so a call's own allocations are its rise (0 without glibc)."""
    if _libc is None:
        return 0
    m = _libc.mallinfo2()
    return int(m.uordblks + m.hblkhd)


def heap_fields() -> dict:
    """mallinfo2's arena (bytes of the main and thread arenas), hblkhd (mmapped chunks), uordblks (arena
    bytes in use), fordblks (arena bytes free) and keepcost: free arena bytes are RSS that no
    allocation holds (fragmentation), unlike uordblks + hblkhd."""
    if _libc is None:
        return {}
    m = _libc.mallinfo2()
    return {k: int(getattr(m, k)) for k in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")}


def garbage_arrays(limit: int = 40) -> dict:
    """Collect Python's cyclic garbage (gc.DEBUG_SAVEALL keeps it in gc.garbage) and return the numpy
    bytes it held: {'kind:name': bytes} over the garbage's frames, dicts, lists, tuples and cells, each
    data buffer once; then drop it.  What a plain run holds until the collector happens to run."""
    import gc

    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        garbage = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    seen, out, kinds = set(), {}, {}
    for obj in garbage:
        kinds[type(obj).__name__] = kinds.get(type(obj).__name__, 0) + 1
        if inspect.isframe(obj):
            items, where = list(obj.f_locals.items()), f"frame {os.path.basename(obj.f_code.co_filename)}:{obj.f_code.co_name}"
        elif isinstance(obj, dict):
            items, where = list(obj.items()), "dict"
        elif isinstance(obj, (list, tuple)):
            items, where = list(enumerate(obj)), type(obj).__name__
        else:
            continue
        for k, v in items:
            if isinstance(v, np.ndarray):
                _count_buffer(v, f"{where}:{k}", seen, out)
    del garbage
    top = dict(sorted(out.items(), key=lambda kv: -kv[1])[:limit])
    return {"objects": int(found), "types": dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:15]),
            "arrays": top, "arrays_total": int(sum(out.values()))}


def smaps_rollup() -> dict:
    """Rss split by kind (/proc/self/smaps_rollup, bytes): Anonymous (heap, mmapped chunks, Python's
    arenas) against file-backed (the libraries' pages)."""
    out = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("Rss", "Anonymous", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty"):
                    out[k] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def top_mappings(limit: int = 16) -> list:
    """[(name, Rss bytes)] of the largest mappings (/proc/self/smaps, anonymous ones as [anon]):
    which library's pages and which anonymous areas (the heap, Python's arenas, MPI's) are resident."""
    import re
    agg, name = {}, None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split()
                    name = parts[5] if len(parts) > 5 else "[anon]"
                elif line.startswith("Rss:") and name is not None:
                    agg[name] = agg.get(name, 0) + int(line.split()[1]) * 1024
    except OSError:
        return []
    return sorted(agg.items(), key=lambda kv: -kv[1])[:limit]


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def live_arrays(frame, depth: int = 3) -> dict:
    """{'function:name[.attr]': bytes} of the numpy arrays reachable from the frames' locals (each data
    buffer counted once, under the first name found, innermost frame first)."""
    seen, out = set(), {}

    def visit(obj, label, depth):
        if isinstance(obj, np.ndarray):
            _count_buffer(obj, label, seen, out)
            return
        if depth == 0 or isinstance(obj, (str, bytes, int, float, type)) or callable(obj) and not hasattr(obj, "__dict__"):
            return
        if inspect.isgenerator(obj):  # a streamed dataset's block generator: what its frame holds
            items = list(obj.gi_frame.f_locals.items()) if obj.gi_frame is not None else []
        elif inspect.isfunction(obj):  # a closure (the produce lambdas): its cells
            items = [(c, cell.cell_contents) for c, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ())
                     if c not in ("self",) and _filled(cell)]
        elif isinstance(obj, dict):
            items = list(obj.items())[:64]
        elif isinstance(obj, (list, tuple)):
            items = list(enumerate(obj))[:64]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type(sys)):
            items = list(vars(obj).items())
        else:
            return
        for k, v in items:
            visit(v, f"{label}.{k}", depth - 1)

    f = frame
    while f is not None:
        fn = f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}"
        for name, v in list(f.f_locals.items()):
            visit(v, f"{fn}:{name}", depth)
        f = f.f_back
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True)
    p.add_argument("--interval", type=float, default=0.005)
    p.add_argument("--probe", choices=("none", "gc", "trim", "mmap"), default="none",
                   help="before every ParMETIS call (after the record of what is alive): gc = collect the "
                        "cyclic garbage and record the arrays it held, trim = malloc_trim(0), mmap = malloc_trim(0) and "
                        "glibc's mmap and trim thresholds fixed at $TRACE_MMAP_MIB MiB (default 1); all record "
                        "VmRSS and malloc's fields after it (a diagnosis: they change the run's peak)")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv

    import preprocess.partition as partition
    from preprocess.__main__ import main as preprocess_main

    calls, samples = [], {}
    main_thread = threading.main_thread().ident
    state = {"label": "start", "stop": False, "heap_max": 0}

    def sampler():
        while not state["stop"]:
            rss = _status("VmRSS")
            label = state["label"]
            if label.startswith("parmetis#"):
                state["heap_max"] = max(state["heap_max"], heap_in_use())
            if rss > samples.get(label, {}).get("rss", 0):
                frame = sys._current_frames().get(main_thread)
                stack = [f"{os.path.basename(fs.filename)}:{fs.lineno} {fs.name}"
                         for fs in traceback.extract_stack(frame)[-8:]] if frame else []
                # Not kept past the sample: a frame object holds its locals, and those of every frame
                # above it, even after they return (session 10's traces: the relabelling's int64 keys
                # and adjacency, ~105 MiB at 2.45M P = 8, alive at the server call until the next sample).
                del frame
                samples[label] = {"rss": rss, "stack": stack}
            time.sleep(a.interval)

    original = partition.parmetis_part_kway

    def traced(pm, comm, vtxdist, xadj, adjncy, nparts, *args, **kw):
        frame = sys._getframe(1)
        arrays = live_arrays(frame)
        # the call's own arguments (a few KiB besides xadj/adjncy) are counted with the caller's names
        rec = {"caller": frame.f_code.co_name, "nparts": int(nparts), "local_rows": int(xadj.shape[0] - 1),
               "local_adj": int(adjncy.shape[0]), "rss_before": _status("VmRSS"),
               "arrays": dict(sorted(arrays.items(), key=lambda kv: -kv[1])[:40]),
               "arrays_total": int(sum(arrays.values())), "heap_before": heap_in_use(),
               "mallinfo_before": heap_fields(), "smaps_before": smaps_rollup(),
               "torch_loaded": "torch" in sys.modules, "mappings": top_mappings()}
        if a.probe == "gc":
            rec["garbage"] = garbage_arrays()
        elif a.probe in ("trim", "mmap") and _libc is not None:
            if a.probe == "mmap":
                mib = int(float(os.environ.get("TRACE_MMAP_MIB", "1")) * 2 ** 20)
                _libc.mallopt(-3, mib)  # M_MMAP_THRESHOLD (fixed: no dynamic raise after)
                _libc.mallopt(-1, mib)  # M_TRIM_THRESHOLD
            _libc.malloc_trim(0)
        if a.probe != "none":
            rec.update(probe_rss=_status("VmRSS"), probe_heap=heap_in_use(), probe_mallinfo=heap_fields())
        state["heap_max"] = heap_in_use()
        state["label"] = f"parmetis#{len(calls)}"
        _reset_hwm()
        t0 = time.process_time()
        try:
            return original(pm, comm, vtxdist, xadj, adjncy, nparts, *args, **kw)
        finally:
            state["label"] = "returning"
            rec.update(hwm_during=_status("VmHWM"), rss_after=_status("VmRSS"), cpu_s=time.process_time() - t0,
                       heap_max_during=state["heap_max"], heap_after=heap_in_use(), mallinfo_after=heap_fields())
            state["label"] = f"after-parmetis#{len(calls)}"
            calls.append(rec)

    partition.parmetis_part_kway = traced

    # halos+write: probes at the server's steps and block rounds; the largest VmRSS record per rank kept.
    import preprocess.dist_build as dist_build
    import preprocess.dist_server as dist_server

    halos = {"best": None, "first": None, "probes": 0}

    def probe(where):
        frame = sys._getframe(1)  # the wrapper: its arguments and result, then the callers
        arrays = live_arrays(frame, depth=6)
        rec = {"where": where, "rss": _status("VmRSS"), "heap": heap_in_use(),
               "arrays": dict(sorted(arrays.items(), key=lambda kv: -kv[1])[:60]),
               "arrays_total": int(sum(arrays.values()))}
        halos["probes"] += 1
        if halos["first"] is None:
            halos["first"] = rec
        if halos["best"] is None or rec["rss"] >= halos["best"]["rss"]:
            halos["best"] = rec

    def probed(fn, where, before=False):
        def wrapper(*args, **kw):
            if before:
                state["label"] = "halos"
                probe(where + ":start")
            out = fn(*args, **kw)
            probe(where)
            return out
        return wrapper

    dist_build.server_datasets = probed(dist_build.server_datasets, "server_datasets", before=True)
    dist_server.select_halo = probed(dist_server.select_halo, "select_halo")
    dist_server.assign_owners_sliced = probed(dist_server.assign_owners_sliced, "assign_owners")
    dist_server._Blocks.gather = probed(dist_server._Blocks.gather, "gather")
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    rc = preprocess_main(argv)
    state["stop"] = True
    th.join()
    from granndis_hpc.cluster import as_group

    group = as_group(None)
    recs = group.allgather_object({"rank": group.rank, "size": group.size, "calls": calls, "samples": samples,
                                  "halos": halos})
    if group.rank == 0:
        with open(a.trace, "w") as f:
            json.dump({"argv": argv, "ranks": recs}, f, indent=1)
        mib = 2.0 ** 20
        for r in recs:
            for i, c in enumerate(r["calls"]):
                print(f"rank {r['rank']}/{r['size']} call {i} ({c['caller']}, {c['local_rows']} rows, "
                      f"{c['local_adj']} adj): before {c['rss_before'] / mib:.0f} MiB (our arrays "
                      f"{c['arrays_total'] / mib:.0f}), during {c['hwm_during'] / mib:.0f}, after "
                      f"{c['rss_after'] / mib:.0f}; malloc in use before {c['heap_before'] / mib:.0f}, max "
                      f"during {c['heap_max_during'] / mib:.0f} (+{(c['heap_max_during'] - c['heap_before']) / mib:.0f})")
                if "probe_rss" in c:
                    g = c.get("garbage", {})
                    print(f"    probe {a.probe}: VmRSS {c['probe_rss'] / mib:.0f} MiB, malloc in use "
                          f"{c['probe_heap'] / mib:.0f}" + (f"; garbage: {g['objects']} objects holding "
                                                            f"{g['arrays_total'] / mib:.0f} MiB of arrays" if g else ""))
            h = r["halos"]
            if h["best"] is not None:
                b, f0 = h["best"], h["first"]
                print(f"rank {r['rank']}/{r['size']} halos+write: at the first server {f0['rss'] / mib:.0f} MiB (our "
                      f"arrays {f0['arrays_total'] / mib:.0f}, malloc {f0['heap'] / mib:.0f}); largest probe "
                      f"({b['where']}) {b['rss'] / mib:.0f} MiB (our arrays {b['arrays_total'] / mib:.0f}, malloc "
                      f"{b['heap'] / mib:.0f}); sampler {r['samples'].get('halos', {}).get('rss', 0) / mib:.0f} MiB")
    return rc


if __name__ == "__main__":
    sys.exit(main())
