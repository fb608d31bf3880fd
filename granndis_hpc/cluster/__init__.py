"""Cluster layer: MPI world, servers, process groups, transports, hierarchical all-reduce and the
byte/time ledger.  Knows nothing about graphs.

The names that need torch (Topology, Communicator, ...) are imported on first use (PEP 562), so that
`preprocess`, which only needs errors and Group, does not pay torch's ~2 s import on every rank.
"""
from importlib import import_module

from .errors import ClusterError, agree, collective_errors, main_guard
from .group import Group, as_group

_LAZY = {
    "allreduce_bytes_model": ".accounting",
    "Communicator": ".comm", "plan_buckets": ".layout",
    "LINKS": ".ledger", "PHASES": ".ledger", "Ledger": ".ledger",
    "Topology": ".topology", "init_topology": ".topology",
}

__all__ = ["Communicator", "ClusterError", "Group", "as_group", "Ledger", "LINKS", "PHASES", "Topology", "agree",
           "collective_errors", "allreduce_bytes_model", "init_topology", "main_guard", "plan_buckets"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
