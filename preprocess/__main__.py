"""`granndis preprocess {build,plan,chunk,verify,info}` (also `python -m granndis_hpc.preprocess`).

  mpirun -n 2 granndis preprocess build --source planetoid --name cora --root DIR \\
      --servers 2 --gpus-per-server 2 --layers 3 --preload full --partitioner parmetis --out shards/cora-full
  mpirun -n 2 granndis preprocess plan --source planetoid --name cora --root DIR \\
      --servers 2 --gpus-per-server 2 --layers 3 --model sage --hidden 64 --memory-per-gpu 40GiB
  granndis preprocess verify shards/cora-full
  granndis preprocess info shards/cora-full
"""
from __future__ import annotations

import os
import shlex
import sys

import numpy as np

from granndis_hpc.options import read_command

from granndis_hpc.preprocess.options import BuildOptions, ChunkOptions, PlanOptions, ShardSetOptions, build_config
from granndis_hpc.preprocess.plan.command import cmd_plan, fail, resolve_build_hops

PROG = "granndis preprocess"
DESCRIPTION = "GraNNDis offline preprocessing"


def cmd_build(args, argv) -> int:
    from granndis_hpc.cluster import as_group

    from granndis_hpc.preprocess import sources
    from granndis_hpc.preprocess.build.pipeline import PHASES, PhaseLog
    from granndis_hpc.preprocess.build.slices import spill_directory

    group = as_group(None)  # MPI.COMM_WORLD, through cluster/ (preprocess never calls MPI itself)
    from granndis_hpc.progress import progress, setup_logging

    setup_logging(group.rank, all_ranks=args.log_all_ranks, level=args.log_level)

    bar = progress(total=len(PHASES), desc="preprocess", rank=group.rank, unit="phase",
                   enabled=True if args.progress else None)
    log = PhaseLog(group, bar=bar)
    command = "granndis preprocess " + shlex.join(argv)
    if group.size > 1:
        command = f"mpirun -n {group.size} " + command
    cfg = build_config(args, command)
    cfg.extra.update(sources.features_record(args.normalize_features))
    printer = lambda line, **_: (bar.write(line) if not bar.disable else print(line, flush=True))  # noqa: E731
    with spill_directory(args.out):  # spill files under the output, which the next build cleans
        return _build(group, args, cfg, log, bar, printer)


def _build(group, args, cfg, log, bar, printer) -> int:
    from granndis_hpc.preprocess import sources
    from granndis_hpc.preprocess.build.pipeline import run_build
    from granndis_hpc.preprocess.build.profile import check_profile_path, write_profile

    profile = os.environ.get("GRANNDIS_BUILD_PROFILE")  # bench/bench_build_scaling.py
    try:
        with group.errors("checking the build profile's path"):
            check_profile_path("GRANNDIS_BUILD_PROFILE", profile if group.rank == 0 else None)  # rank 0 writes it
        with group.errors("opening the dataset"):
            sliced = None if args.whole_graph else sources.sliced_from_args(args)
        if sliced is not None:
            # Every rank reads 1/P of the edges and rows, the ranks canonicalise together
            # (preprocess/build/sliced.py) and every later phase works on the slices (preprocess/build/distributed.py),
            # --hops auto's counts included (preprocess/plan/halo_counts.py).
            from granndis_hpc.preprocess.build.distributed import run_build_sliced
            from granndis_hpc.preprocess.build.sliced import load_slice, slice_digest

            part = load_slice(group, sliced, symmetrize=args.symmetrize, self_loops=args.self_loops,
                              normalize=args.normalize_features)
            content_digest = slice_digest(group, part)
            log.done("load", f"{part.name}: {part.num_vertices} vertices, {part.num_edges} edges, "
                             f"{part.num_features} features (rank 0 holds rows {part.lo}..{part.hi - 1})")
            cfg.hops = resolve_build_hops(group, part, args, printer=printer, record=cfg.extra)
            run_build_sliced(group, part, cfg, log, content_digest=content_digest)
        else:
            with group.errors("loading the dataset"):
                graph = sources.load_from_args(args)
            log.done("load", f"{graph.name}: {graph.num_vertices} vertices, {graph.num_edges} edges, "
                             f"{graph.num_features} features")
            cfg.hops = resolve_build_hops(group, graph, args, printer=printer, record=cfg.extra)
            run_build(group, graph, cfg, log)
    except Exception as exc:  # noqa: BLE001
        return fail(group, "build", exc)
    write_profile(log, profile)
    bar.close()
    if group.rank == 0:
        print(f"[preprocess] wrote {cfg.out}; check it with `granndis preprocess verify {cfg.out}`", flush=True)
    return 0


def cmd_chunk(args, argv) -> int:
    """Write the chunked input format from any source, one chunk in memory at a time where the source
    is sliced (synthetic, chunked), else from the loaded canonical graph."""
    from granndis_hpc.preprocess import sources
    from granndis_hpc.preprocess.formats.chunked import graph_pieces, split_ranges, write_chunked

    try:
        sliced = sources.sliced_from_args(args)
        if sliced is not None:
            C = int(args.chunks)
            bounds = split_ranges(sliced.num_vertices, C)

            def edges():
                for c in range(C):
                    parts = list(sliced.edge_pieces(c, C))
                    src = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
                    dst = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
                    yield src, dst

            def nodes():
                for c in range(C):
                    got = sliced.nodes(int(bounds[c]), int(bounds[c + 1]))
                    yield {f: np.concatenate([a for _, a in pieces]) for f, pieces in got.items()}

            meta = write_chunked(args.out, name=sliced.name, num_vertices=sliced.num_vertices,
                                 num_features=sliced.num_features, num_classes=sliced.num_classes,
                                 edge_pieces=edges(), node_pieces=nodes(),
                                 canonical=getattr(sliced, "canonical", None))
        else:
            args.normalize_features = "none"  # raw features; the build applies --normalize-features
            graph = sources.load_from_args(args)
            e, n = graph_pieces(graph, int(args.chunks))
            meta = write_chunked(args.out, name=graph.name, num_vertices=graph.num_vertices,
                                 num_features=graph.num_features, num_classes=graph.num_classes, edge_pieces=e,
                                 node_pieces=n, canonical={"symmetrize": bool(args.symmetrize),
                                                           "self_loops": args.self_loops})
    except Exception as exc:  # noqa: BLE001
        print(f"preprocess chunk: error: {exc}", file=sys.stderr)
        return 1
    print(f"[preprocess] wrote {args.out}: {meta['num_vertices']} vertices, {meta['num_edges']} edges in "
          f"{len(meta['edges']['chunks'])} edge and {len(meta['nodes']['rows'])} node chunks; build from it with "
          f"`--source chunked --path {args.out}`", flush=True)
    return 0


def cmd_verify(args, argv) -> int:
    from granndis_hpc.preprocess.verify.command import verify_shard_set

    try:
        problems = verify_shard_set(args.dir)
    except OSError as exc:  # a file verify could not read (the checks above name the usual ones)
        print(f"preprocess verify: error: {exc.filename or args.dir}: cannot be read ({exc.strerror or exc}); "
              f"check its permissions", file=sys.stderr)
        return 1
    if problems:
        for p in problems:
            print(f"PROBLEM: {p}")
        print(f"{args.dir}: {len(problems)} problem(s)")
        return 1
    print(f"OK: {args.dir}")
    return 0


def cmd_info(args, argv) -> int:
    from granndis_hpc.shards import ShardError, read_manifest

    from granndis_hpc.preprocess.verify.command import format_info

    try:
        print(format_info(read_manifest(args.dir)))
    except ShardError as exc:
        print(f"preprocess info: error: {exc}", file=sys.stderr)
        return 1
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a field of an unexpected type
        print(f"preprocess info: error: {args.dir}/manifest.json: a field has an unexpected value "
              f"({type(exc).__name__}: {exc}); run `granndis preprocess verify {args.dir}`, or rebuild the set",
              file=sys.stderr)
        return 1
    return 0


# Every command: its options class (preprocess/options.py), a line of help, and what runs it.
COMMANDS = {
    "build": (BuildOptions, "partition a dataset and write a shard set (run under mpirun, or with 1 rank)", cmd_build),
    "plan": (PlanOptions, "estimate memory per GPU and inter-server bytes of every build, and recommend one (writes "
                          "no shard; run under mpirun, or with 1 rank)", cmd_plan),
    "chunk": (ChunkOptions, "convert any source into the chunked input format (memory-mappable .npy chunks + "
                            "metadata.json) that build ranks read slice by slice", cmd_chunk),
    "verify": (ShardSetOptions, "check checksums and invariants of a shard set; exit 1 on problems", cmd_verify),
    "info": (ShardSetOptions, "print the statistics of a shard set and its partition digest (equal digests: the "
                              "same server and GPU for every vertex)", cmd_info),
}


def main(argv=None) -> int:
    """Parse (command line > --config FILE.toml > defaults, every value checked: a bad one is the
    subcommand's usage error, exit status 2, on every rank) and run the command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name, args = read_command({k: (cls, text) for k, (cls, text, _) in COMMANDS.items()}, argv, PROG, DESCRIPTION)
    return int(COMMANDS[name][2](args, argv))


if __name__ == "__main__":
    sys.exit(main())
