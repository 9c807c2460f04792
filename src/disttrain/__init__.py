"""disttrain: PyTorch distributed training in one command."""
