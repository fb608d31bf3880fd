#!/usr/bin/env bash
# The device check: the first thing to run on a GPU machine.  Builds its own shard sets (real Cora from
# tests/data and a 200k-vertex synthetic graph, 2 servers x 1 rank), runs the CUDA unit tests, then
# bench/gpu_check.py under mpirun: every mode with overlap on and off and bf16 halos on the GPU against
# the same runs on the CPU (logits), the host syncs of a steady step, peak reserved memory and epoch
# times, the GPU set before MPI started and the thread level, cob's loader stream; with 2+ GPUs, 1 server
# x G ranks over NCCL too.  Exits non-zero on any mismatch or failure.
#
#   OUT=bench-out/gpu-check bash bench/gpu_check.sh              # on a GPU machine (about 5 minutes)
#   OUT=bench-out/gpu-smoke bash bench/gpu_check.sh --cpu-smoke  # this script's own logic on the CPU
#
# Results: $OUT/results.jsonl (one line per case), logs in $OUT.
set -u
SMOKE=0
[ "${1:-}" = "--cpu-smoke" ] && SMOKE=1
eval "$(python3 bench/harness.py env --shell)"
# The interpreter of an environment with granndis-hpc installed (make setup's .venv by default).
PY=${PY:-.venv/bin/python}
"$PY" -c "import granndis_hpc.preprocess" 2>/dev/null || {
  echo "gpu_check: $PY cannot import granndis_hpc: install the package (make setup, or pip install .) and give PY=" >&2
  exit 2; }
OUT=${OUT:-bench-out/gpu-check}
mkdir -p "$OUT"
: > "$OUT/results.jsonl"
status=0
start=$SECONDS

build() {  # build NAME ARGS...: a shard set under $OUT/shards (kept between runs)
  local name=$1; shift
  [ -f "$OUT/shards/$name/manifest.json" ] && return 0
  rm -rf "$OUT/shards/$name"
  if ! timeout 400 "$PY" -m granndis_hpc.preprocess build "$@" --layers 3 --preload full --partitioner metis \
       --seed 0 --out "$OUT/shards/$name" > "$OUT/build-$name.log" 2>&1; then
    echo "FAILED: building $name (see $OUT/build-$name.log)"; tail -3 "$OUT/build-$name.log"; status=1; return 1
  fi
}

check() {  # check RANKS SET ARGS...: bench/gpu_check.py on RANKS ranks
  local n=$1 set=$2; shift 2
  echo "== $set on $n rank(s): $*"
  timeout 420 mpirun -n "$n" "$PY" bench/gpu_check.py --shards "$OUT/shards/$set" --out "$OUT/results.jsonl" "$@" \
    > "$OUT/check-$set.log" 2>&1 || status=1
  grep '^{' "$OUT/check-$set.log" | "$PY" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(("ok  " if r["ok"] else "BAD ") + r["case"], {k: r.get(k) for k in ("logits_rel_err", "syncs_per_step",
          "sync_calls", "peak_reserved_mib", "epoch_s", "gpu_before_mpi", "thread_level", "loader_stream", "error") if r.get(k) not in (None, [])})'
  grep -q '"ok": false' "$OUT/check-$set.log" && status=1
  grep -q '^{' "$OUT/check-$set.log" || { echo "FAILED: no result (see $OUT/check-$set.log)"; tail -5 "$OUT/check-$set.log"; status=1; }
}

if [ $SMOKE = 1 ]; then
  build syn-2x1 --source synthetic --vertices 3000 --servers 2 --gpus-per-server 1 && \
    check 2 syn-2x1 --device cpu --epochs 2
else
  unset OMP_NUM_THREADS  # the device's CPU threads are left to torch
  nvidia-smi -L
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"
  GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  echo "== nn on CUDA (unit tests with their CUDA cases)"
  timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_nn_graph.py tests/unit/test_nn_models.py \
    tests/unit/test_hostsync.py tests/unit/test_staging.py tests/unit/test_scatter_dropout_memory.py \
    tests/unit/test_mpistart.py tests/unit/test_cobstream.py 2>&1 | tail -3 \
    | tee "$OUT/unit.log"
  grep -q "failed\|error" "$OUT/unit.log" && status=1
  # --share-gpus: the 2 emulated servers share the GPU(s) on purpose
  build cora-2x1 --source planetoid --name cora --root tests/data/planetoid --servers 2 --gpus-per-server 1 && \
    check 2 cora-2x1 --device cuda --share-gpus
  build syn200k-2x1 --source synthetic --vertices 200000 --servers 2 --gpus-per-server 1 && \
    check 2 syn200k-2x1 --device cuda --share-gpus --epochs 3 --cases fb,fb-noovl,fb-bf16,flx
  if [ "${GPUS:-1}" -ge 2 ]; then  # NCCL inside one server of G GPUs
    build "cora-1x$GPUS" --source planetoid --name cora --root tests/data/planetoid --servers 1 --gpus-per-server "$GPUS" && \
      check "$GPUS" "cora-1x$GPUS" --device cuda --ranks-per-server "$GPUS" --intra-transport nccl --cases fb,flx,flx-noovl,cob
  fi
fi
echo "== $(( SECONDS - start )) s; $(grep -c '"ok": true' "$OUT/results.jsonl") case(s) ok," \
     "$(grep -c '"ok": false' "$OUT/results.jsonl") failed; exit $status"
exit $status
