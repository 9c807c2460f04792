"""The training loop and its metrics."""
