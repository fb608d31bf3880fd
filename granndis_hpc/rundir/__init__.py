"""The run directory: its lock, resolved configuration, metrics, checkpoints, best model and summary."""
