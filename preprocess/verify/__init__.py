"""`granndis preprocess verify` and `info` (command.py), with the bounded-memory content checks
(content.py) and an inductive set's recomputed datasets (inductive.py)."""
