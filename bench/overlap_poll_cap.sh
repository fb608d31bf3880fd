#!/bin/sh
# bench/overlap_poll_cap.sh NAME CAP_S [--reverse-modes]: one pass of fb beside fb --no-overlap, unshaped and
# at 100 Mbit/s, on the 200k local graph (2 x 2, emulated cluster), with the progress thread's back-off
# capped at CAP_S seconds; one exclusive hold of the bench and emu locks.  docs/overlap.md ("Alternating
# passes") ran a 0.016, b 0.004 --reverse-modes, c 0.004, d 0.016 --reverse-modes.  SHARDS=DIR reuses a
# built 200k `shards-full` set in DIR (bench_cluster.py --work DIR of an earlier run); otherwise the
# first pass builds it.
set -e
[ -n "$SHARDS" ] && SHARDS=$(cd "$SHARDS" && pwd)
cd "$(dirname "$0")/.."
n=$1; cap=$2; shift 2
w=bench-out/pc$n; mkdir -p $w
[ -n "$SHARDS" ] && [ ! -e $w/shards-full ] && ln -s "$SHARDS/shards-full" $w/shards-full
echo "pass $n cap $cap start $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
GRANNDIS_PROGRESS_POLL=0.001,2,$cap flock -x /tmp/granndis-bench.lock flock /tmp/granndis-emu.lock \
    timeout 600 .venv/bin/python bench/bench_cluster.py --vertices 200000 --generator local --reuse-shards \
    --no-repeat --epochs 4 --modes fb,fb-noovl --rates unshaped,100mbit --work $w --out $w/page.md "$@"
echo "pass $n end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
