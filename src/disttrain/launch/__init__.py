"""Process launching only: ``torchrun`` (the one way any command starts workers, local, multi-node, elastic),
``network`` (addresses, interfaces), ``agent_watch`` (a launcher outliving a lost rendezvous), ``slurm`` (sbatch,
requeue) and ``debug_env``. What each command launches, and its worker entry, live in :mod:`disttrain.jobs`.

May import everything below it (config, build, parallel, plan, train, checkpoint, health), never ``jobs``.
"""
