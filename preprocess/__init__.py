"""Offline preprocessing: load + canonicalise a dataset, partition it over servers and GPUs, preload
halos (full k-hop or Expansion-aware Sampling) and write the HDF5 shard set (docs/design.md §2, §5).

Entry point: `granndis preprocess {build,verify,info}` (see preprocess/__main__.py).
This package may import granndis_hpc.shards and granndis_hpc.graph, never the engine.
"""
