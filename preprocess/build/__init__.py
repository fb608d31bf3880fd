"""Writing a shard set: the whole-graph pipeline (pipeline.py), the distributed build over the ranks'
slices (distributed.py, dist_server.py, sliced.py, slices.py), the preloaded halos (halo.py) and what an
inductive build adds (inductive.py)."""
