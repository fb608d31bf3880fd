#!/bin/bash
# eas and a 56-layer cob model with --overlap-halos all|world against --no-overlap, 2 servers x 2 ranks,
# the order alternated between passes (docs/overlap.md, "Which halos overlap by default").  Run it alone:
#   flock -x /tmp/granndis-bench.lock bash bench/overlap_server_halos.sh EAS_SHARDS DEEP_SHARDS [OUT_DIR]
# EAS_SHARDS: the 200k local graph's EAS set (bench_cluster.py --vertices 200000 --generator local,
# WORK/shards-eas); DEEP_SHARDS: the 10k 56-layer EAS set (bench_cobatch.py --deep, WORK/shards-eas-deep).
# Prints, per run, the epoch times and the medians after epoch 0 from the run's metrics.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
EAS=${1:?EAS shard directory}; DEEP=${2:?deep EAS shard directory}; W=${3:-bench-out/overlap-server-halos}
eval "$(python3 bench/harness.py env | sed 's/^/export /')"
mkdir -p "$W"
run() {  # name shards extra...
  local name=$1 shards=$2; shift 2
  rm -rf "$W/$name"
  timeout 300 mpirun -n 4 .venv/bin/python -m granndis_hpc.cli train --shards "$shards" --ranks-per-server 2 \
    --eval-every 0 --quiet --out "$W/$name" "$@" > "$W/$name.log" 2>&1
  .venv/bin/python - "$W/$name" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
med = lambda k: round(statistics.median(r[k] for r in recs[1:]), 3)
print(sys.argv[1].split("/")[-1], "time", [round(r["time_s"], 3) for r in recs], "median(1:)", med("time_s"),
      "compute", med("compute_s"), "intra", med("intra_comm_s"), "grad", med("grad_sync_s"),
      "loss", recs[-1]["loss"], "intra_halo", recs[-1]["bytes"]["intra_halo"], flush=True)
PY
}
E="--mode eas --model sage --layers 3 --hidden 64 --epochs 5"
D="--mode cob --batches-per-epoch 4 --fanout 10 --model ressage --layers 56 --hidden 64 --epochs 3"
echo "start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
for setting in all world; do
  for pass in 1 2; do
    pair() {  # name shards options: overlapped first in pass 1, --no-overlap first in pass 2
      local name=$1 shards=$2; shift 2
      if [ "$pass" = 1 ]; then
        run "$name-$setting-$pass" "$shards" "$@" --overlap-halos "$setting"; run "$name-noovl-$setting-$pass" "$shards" "$@" --no-overlap
      else
        run "$name-noovl-$setting-$pass" "$shards" "$@" --no-overlap; run "$name-$setting-$pass" "$shards" "$@" --overlap-halos "$setting"
      fi
    }
    pair eas "$EAS" $E
    pair deep "$DEEP" $D
    echo "$setting pass $pass done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
