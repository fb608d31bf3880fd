"""Input formats on disk: our chunked format (chunked.py), DistDGL's chunked graph format (distdgl.py),
and the safe reading of the files their metadata names (inputfiles.py, chunkrange.py)."""
