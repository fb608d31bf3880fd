#!/usr/bin/env bash
# `make demo`: the main job on 2 emulated servers x 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mpirun -n 4 $PY -m granndis_hpc.cluster.selfcheck --ranks-per-server 2
