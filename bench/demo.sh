#!/usr/bin/env bash
# `make demo`: the main job on one machine, 2 emulated servers x 2 ranks.
# Built-in synthetic graph -> shards (full 3-hop preload, and EAS h=1 f=15) -> fb, flx, eas -> report.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${DEMO_OUT:-demo-out}
VERTICES=${DEMO_VERTICES:-20000}
EPOCHS=${DEMO_EPOCHS:-30}
MPI="mpirun -n 4"
mkdir -p "$OUT"

echo "== preprocessing: synthetic graph, $VERTICES vertices, 2 servers x 2 GPUs"
mpirun -n 2 $PY -m preprocess build --source synthetic --vertices "$VERTICES" --seed 0 \
    --servers 2 --gpus-per-server 2 --layers 3 --preload full --out "$OUT/shards-full" --overwrite
mpirun -n 2 $PY -m preprocess build --source synthetic --vertices "$VERTICES" --seed 0 \
    --servers 2 --gpus-per-server 2 --layers 3 --preload eas --hops 1 --fanout 15 --out "$OUT/shards-eas" --overwrite

common=(--ranks-per-server 2 --model sage --layers 3 --hidden 64 --epochs "$EPOCHS" --lr 0.01 --dropout 0.5 --eval-every 10)
for mode in fb flx eas; do
    shards="$OUT/shards-full"; [ "$mode" = eas ] && shards="$OUT/shards-eas"
    echo "== training: mode $mode"
    $MPI $PY -m granndis_hpc.cli train --shards "$shards" --mode "$mode" "${common[@]}" --out "$OUT/runs/$mode" --overwrite-run
done

echo "== report"
$PY -m granndis_hpc.cli report "$OUT/runs/fb" "$OUT/runs/flx" "$OUT/runs/eas" --out "$OUT/report"
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
print(f"\n{'mode':<5} {'epoch (s)':>10} {'intra halo B':>14} {'inter halo B':>14} {'inter grad B':>14} {'test acc':>9}")
for mode in ("fb", "flx", "eas"):
    s = json.load(open(f"{out}/runs/{mode}/summary.json"))
    b = s["bytes_per_epoch"]
    print(f"{mode:<5} {s['epoch_time_s']:>10.4f} {b['intra_halo']:>14,} {b['inter_halo']:>14,} "
          f"{b['inter_grad']:>14,} {s['accuracy']['test']:>9.4f}")
PYEOF
