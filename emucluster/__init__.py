"""The emulated multi-server cluster on one machine (docs/emulated-cluster.md), used by `make demo`, the
tests and the benchmarks: each server a network + UTS namespace, the servers joined by a shaped link.

- cluster: set-up, shaping, teardown, `mpirun` across the servers (the emu-cluster and emu-mpirun
  commands beside this file);
- config, launch, check: what an instance is, how ranks are started in it, the self-check;
- costmodel: the epoch-time model of a link-rate sweep; pingpong: the MPI link check;
- mpienv: how mpirun runs on one machine (the environment every test and benchmark uses).

Standard library only, so the command-line tools run with the system python3."""
