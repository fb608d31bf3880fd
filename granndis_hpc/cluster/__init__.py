"""Cluster layer: MPI world, servers, process groups, transports, hierarchical all-reduce and the
byte/time ledger.  Knows nothing about graphs."""
from .accounting import allreduce_bytes_model
from .comm import Communicator, plan_buckets
from .errors import ClusterError, agree, collective_errors, main_guard
from .ledger import LINKS, PHASES, Ledger
from .topology import Topology, init_topology

__all__ = ["Communicator", "ClusterError", "Ledger", "LINKS", "PHASES", "Topology", "agree", "collective_errors",
           "allreduce_bytes_model", "init_topology", "main_guard", "plan_buckets"]
