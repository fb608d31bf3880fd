# One-command setup, demo and tests.  Every target installs what it needs, idempotently:
# Debian packages (Open MPI, PT-Scotch's ParMETIS) when missing, then a .venv with the CPU torch wheel.
SHELL := /bin/bash
PY    := .venv/bin/python
STAMP := .stamps
# The MPI environment (root allowed, oversubscribed, one thread per rank): its one definition is
# emucluster/mpienv.py's MPI_ENV, which the tests and the benchmarks use too.
$(foreach kv,$(shell python3 -m emucluster.mpienv env),$(eval export $(kv)))
RANKS_PER_SERVER := $(shell python3 -m emucluster.mpienv ranks-per-server)
MPIRUN := mpirun -n 4
APT_PKGS := openmpi-bin libopenmpi-dev libscotchparmetis-dev

.PHONY: setup demo test test-fast lint typecheck test-unit test-launch test-mpi test-slurm bench bench-cluster clean

setup: $(STAMP)/apt $(STAMP)/venv $(STAMP)/slurm

$(STAMP)/apt:
	@mkdir -p $(STAMP)
	@if command -v mpirun >/dev/null && dpkg -s $(APT_PKGS) >/dev/null 2>&1; then \
	  echo "setup: Debian packages present"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PKGS); \
	else \
	  echo "setup: need $(APT_PKGS) (run as root, or see README 'Installing on a cluster')" >&2; exit 1; \
	fi
	@touch $@

# A real Slurm for the tests that submit slurm/*.sbatch (Debian's slurmctld, slurmd, slurm-client, munge;
# their own services are kept from starting).  Where not root those tests skip, saying why.
$(STAMP)/slurm:
	@mkdir -p $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
	  timeout --kill-after=10 900 slurm/testing/slurm-cluster install && touch $@; \
	else \
	  echo "setup: not root: Slurm not installed (the real-Slurm tests will skip; see slurm/README.md)"; \
	fi

# Rebuilt when the build's inputs change: the editable install compiles the C kernels in place.
$(STAMP)/venv: pyproject.toml setup.py granndis_hpc/nn/cpu_kernels.c granndis_hpc/nn/cpu_kernels_module.c \
               emucluster/pyproject.toml
	@mkdir -p $(STAMP)
	@[ -x $(PY) ] || python3 -m venv .venv
	@# Pin the CPU wheel first: a looser requirement would pull a multi-GB CUDA build.
	@$(PY) -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
	.venv/bin/pip install -q -e '.[test,pyg]'
	@# The emulated cluster, a development tool the tests and benchmarks import (not in the wheel).
	.venv/bin/pip install -q -e ./emucluster
	@touch $@

demo: setup
	bash bench/demo.sh

# Undefined names, unused imports and variables, syntax errors (pyproject.toml [tool.ruff]): seconds.
lint: setup
	$(PY) -m ruff check .

# Types of the core packages (pyproject.toml [tool.mypy]: nn, cluster, memory_model, engine, and the
# modules left out with the reason): under a minute cold, seconds with its cache (.mypy_cache).
typecheck: setup
	$(PY) -m mypy

test-unit: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=20 tests/unit

# 2 emulated servers x 2 ranks by default; tests that need other shapes build them from the world.
test-mpi: setup
	GRANNDIS_RANKS_PER_SERVER=$(RANKS_PER_SERVER) $(MPIRUN) $(PY) -m pytest -q -p no:cacheprovider --with-mpi -m mpi --durations=20 tests/mpi

# Tests that start their own mpirun (or a Slurm job), one job at a time (beside the other lanes in `make test`);
# tests/unit starts none.
test-launch: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=20 tests/launch

# The three lanes run side by side, with lint and the type check beside them: a launch test spends much of
# its time starting and stopping its own mpirun and the MPI ranks wait on each other, so one lane alone
# leaves the cores idle.  Each lane's output is printed whole when the lane ends; the status is non-zero if
# any fails, and then the last lines say which test each MPI rank was in (tests/mpi/conftest.py).
test: setup
	@rm -rf .test-progress && mkdir .test-progress
	@GRANNDIS_TEST_PROGRESS_DIR=$(CURDIR)/.test-progress \
	    $(MAKE) --no-print-directory -j5 --output-sync=target lint typecheck test-unit test-launch test-mpi \
	    || { echo "make test failed; where the MPI lane's ranks were:"; cat .test-progress/mpi-rank-* 2>/dev/null; exit 1; }

# The edit loop's lane (a few minutes): lint, types, the serial tests but the slow ones, and the exact-logits
# tests of the distributed engine on 2 emulated servers x 2 ranks (homogeneous and heterogeneous).
FAST_MPI_TESTS ?= tests/mpi/test_engine_exact.py tests/mpi/test_hetero_exact.py
test-fast: lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" tests/unit
	GRANNDIS_RANKS_PER_SERVER=$(RANKS_PER_SERVER) $(MPIRUN) $(PY) -m pytest -q -p no:cacheprovider --with-mpi -m mpi \
	    -k logits $(FAST_MPI_TESTS)

# The longer real-Slurm scenarios (time limit + requeue + resume, signals during set-up, scancel,
# scontrol requeue, a job failing every attempt): ~10 min; results in docs/slurm-scenarios.md.
test-slurm: setup
	timeout --kill-after=30 1800 $(PY) -m pytest -q -p no:cacheprovider -rs tests/slurm

# The communication benchmark (docs/performance/comm.md); results under bench-out/ (not tracked).
bench: setup
	mkdir -p bench-out
	$(MPIRUN) $(PY) bench/bench_comm.py --out bench-out/comm.json --md bench-out/comm.md

# fb, flx, eas, cob on an emulated 2-server cluster (namespaces + tc tbf; needs root) at several link
# rates, and the report with its speedup-against-rate plot; ~25 min on 2 busy cores.  Everything goes
# under bench-out/ (not tracked): docs/performance/cluster.md says what the results mean.
# A quick look: make bench-cluster BENCH_CLUSTER_ARGS='--rates unshaped,100mbit --modes fb,flx'
# `timeout` bounds the whole sweep; the script tears the cluster down on exit, failure or SIGTERM.
BENCH_CLUSTER_WORK ?= bench-out/cluster
bench-cluster: setup
	timeout --kill-after=30 2400 $(PY) bench/bench_cluster.py --work $(BENCH_CLUSTER_WORK) \
	    --out $(BENCH_CLUSTER_WORK)/cluster.md $(BENCH_CLUSTER_ARGS)
	$(PY) -m granndis_hpc.cli report --sweep $(BENCH_CLUSTER_WORK)/runs --out $(BENCH_CLUSTER_WORK)/report

clean:
	rm -rf $(STAMP) .venv build *.egg-info
