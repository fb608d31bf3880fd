"""Partitioning: servers then GPUs (twolevel.py, gpu_split.py), METIS and ParMETIS (parmetis.py), a
locality order for the partitioner (locality.py), owner GPUs (owners.py) and the row order inside a
server file (row_blocks.py)."""
