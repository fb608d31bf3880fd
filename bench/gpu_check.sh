#!/usr/bin/env bash
# Device check for granndis-hpc: CUDA models, the trainer on GPU (1 rank, and 2 servers x 1 rank with
# MPI between them when an MPI is present), timings.  Everything it prints lands in $OUT/log.
# The MPI environment of the tests and benchmarks (bench/harness.py); but the device's CPU threads are
# left to torch (one GPU rank at a time here, or two on 16 cores), as before.
eval "$(python3 bench/harness.py env --shell)"
unset OMP_NUM_THREADS
export PYTHONPATH=$PWD
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
python3 -c "from mpi4py import MPI; print('mpi4py ok:', MPI.Get_library_version()[:40])" 2>&1 | tail -1
which mpirun || echo "no mpirun"
echo "== nn on CUDA (unit tests incl. CUDA cases)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/unit/test_nn_graph.py tests/unit/test_nn_models.py 2>&1 | tail -4
echo "== trainer, 1 rank, cuda, Cora (2-layer, full preload)"
for m in fb flx cob; do
  timeout 90 python3 -m granndis_hpc.cli train --shards ${GPU_SHARDS:-.gpu}/cora-1x1 --ranks-per-server 1 --device cuda --mode $m \
     --model gcn --layers 2 --hidden 64 --epochs 100 --dropout 0.5 --weight-decay 5e-4 --eval-every 0 --quiet \
     --batches-per-epoch 2 --fanout 10 --out $OUT/cora-$m 2>&1 | tail -3
  python3 -c "import json;s=json.load(open('$OUT/cora-$m/summary.json'));print('$m', 'epoch_s', round(s['epoch_time_s'],5), 'test', s['accuracy']['test'], 'peak_MiB', s['peak_memory_bytes']>>20, 'act_MiB', s['activation_memory_bytes']>>20)" 2>&1 | tail -1
done
echo "== ressage (2 layers) with and without activation checkpointing on cuda"
for ck in "" "--checkpoint-activations"; do
  timeout 90 python3 -m granndis_hpc.cli train --shards ${GPU_SHARDS:-.gpu}/cora-1x1 --ranks-per-server 1 --device cuda --mode flx \
     --model ressage --layers 2 --hidden 64 --epochs 20 --eval-every 0 --quiet $ck --out $OUT/res$ck 2>&1 | tail -2
done
if command -v mpirun >/dev/null; then
  echo "== 2 servers x 1 rank on one GPU, synthetic 20k, fb vs flx (MPI between servers, CPU-staged)"
  for m in fb flx; do
    timeout 120 mpirun -n 2 python3 -m granndis_hpc.cli train --shards ${GPU_SHARDS:-.gpu}/syn-2x1 --ranks-per-server 1 --device cuda \
      --mode $m --model sage --layers 3 --hidden 64 --epochs 20 --eval-every 0 --quiet --out $OUT/syn-$m 2>&1 | tail -3
    python3 -c "import json;s=json.load(open('$OUT/syn-$m/summary.json'));print('$m', s['epoch_time_s'], s['seconds_per_epoch'], s['bytes_per_epoch'], s['accuracy'])" 2>&1 | tail -1
  done
fi
