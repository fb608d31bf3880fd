"""Partitioning: servers then GPUs (twolevel.py, gpu_split.py), METIS (metis.py) and ParMETIS
(parmetis.py) with their C types read from the loaded library (native_types.py), a locality order for
the partitioner (locality.py), owner GPUs (owners.py) and the row order inside a server file
(row_blocks.py)."""
