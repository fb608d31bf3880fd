#!/usr/bin/env bash
# The device check: the first thing to run on a GPU machine (docs/gpu-check.md).  Its stages, their
# timeouts, the overall deadline and the report are bench/gpu_check_driver.py's; this only finds an
# interpreter to run that driver (it needs nothing but the standard library).
#
#   OUT=bench-out/gpu-check bash bench/gpu_check.sh                 # on a GPU machine (8 minutes at most)
#   OUT=bench-out/gpu-fake bash bench/gpu_check.sh --fake-device    # the CPU stands in for the GPU
#   GPU_CHECK_DEADLINE_S=300 bash bench/gpu_check.sh --stages env,unit-cuda,exact
#
# Report: $OUT/report.md and $OUT/report.json, rewritten after every stage; logs beside them.
# Exit status: 0 all passed, 1 a stage failed or timed out, 2 some stages were not reached.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
driver_py=python3
command -v "$driver_py" >/dev/null 2>&1 || driver_py=python
exec "$driver_py" bench/gpu_check_driver.py "$@"
