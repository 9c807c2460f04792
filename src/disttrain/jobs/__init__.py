"""Jobs: one module per command's job, the parent side (resolve, run folder, start workers) and its worker
entry. The only layer that starts processes; the engines below it (train, plan, checkpoint, health, ps, rl)
never launch anything.

- ``run`` / ``run_worker``: ``disttrain run`` and the training worker torchrun starts
- ``estimate`` / ``measure``: ``disttrain estimate`` and ``--measure`` (real steps on real workers)
- ``ps`` / ``ps_worker``, ``rl`` / ``rl_worker``: the parameter server and reinforcement learning
- ``doctor`` / ``doctor_worker``: is this machine ready
"""
