"""Starting workers: ``torchrun`` (the one way any command starts workers), ``worker`` (a training worker's
main), ``resolve`` (the parent's decisions before any worker starts), ``debug_env`` and ``doctor``.

The top of the flow: may import everything below it (config, build, dist, plan, train, checkpoint, health).
"""
