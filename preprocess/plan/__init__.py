"""`granndis preprocess plan`: what each build would cost per GPU without writing a shard (command.py),
counted from the build ranks' slices (halo_counts.py, induced_counts.py, sets.py, build_memory.py)."""
