"""``disttrain ps --k8s KIND`` and ``disttrain rl --k8s KIND``: the RPC jobs as a PyTorchJob or JobSet manifest,
through the same writer as ``run``'s (:func:`disttrain.jobs.k8s.write_pods`): one pod per node running the
command's own launcher on the job's config (the ConfigMap), which reads its node rank and the rendezvous from
the operator's variables as ``run`` does; the run folder on the volume, so a rescheduled job resumes from its
checkpoints.

What a pod's memory counts, besides each process's base (:data:`disttrain.launch.k8s.resources.PROCESS_BASE`)
and /dev/shm (:data:`RPC_SHM_PER_PROCESS`); every pod asks for the fullest node's (one pod template: a JobSet's
indexed pods share it):

- ``ps``: the servers' shards on the node, rows and optimizer state as ``ps --plan`` counts them (a spare
  server: the largest shard, which it loads when it takes a dead server's place), twice (a resumed server reads
  its checkpoint whole before it copies it in), and each trainer's row cache (``ps.cache_rows``).
- ``rl``: on the learner's node (node 0), the replay, ``rl.replay_capacity`` x one transition's bytes (obs and
  next_obs in the observation's dtype, 20 bytes of action, reward, done and discount; the priorities' sum tree),
  twice (a resumed learner reads its checkpoint, replay included, before it copies it in); the networks are
  small beside it and in the process's base. reinforce keeps no replay.

Neither saves when stopped (their checkpoints are periodic, ``checkpoint.interval``): the grace period is
``launch.preempt_grace_s`` and the launcher's exit, with no planned save.
"""

from __future__ import annotations

from pathlib import Path

from disttrain.config import to_toml
from disttrain.errors import ConfigError
from disttrain.jobs.k8s import check_k8s, pod_config, write_pods
from disttrain.launch.k8s.manifest import CONFIG_DIR, CONFIG_FILE, job_name
from disttrain.launch.k8s.resources import pod_resources
from disttrain.ps.config import PSJobConfig
from disttrain.rl.config import RLJobConfig
from disttrain.rl.envs import EnvSpec

RPC_SHM_PER_PROCESS = 2**28
"""/dev/shm of a ps or rl process (auto): no data loader or NCCL, only TensorPipe's shared-memory rings to the
other processes of its pod (a few MiB each); 256 MiB, not run's 2 GiB."""
TRANSITION_SCALARS = 8 + 4 + 4 + 4
"""A transition's action (int64), reward, done and discount (float32) in the replay."""


def fixed_group_restarts(kind: str, max_restarts: int, what: str) -> None:
    """A PyTorchJob restarts a failed pod alone; a job whose launcher starts its RPC group itself cannot take
    the restarted pod back: one line, the JobSet (which restarts every pod together) as the fix."""
    if kind == "pytorchjob" and max_restarts:
        raise ConfigError(
            f"{what} on a PyTorchJob with launch.max_restarts {max_restarts}: the operator restarts a failed pod "
            "alone, and the RPC group is fixed when it starts, so the restarted pod could not rejoin it; use "
            "--k8s jobset (its failurePolicy restarts every pod together; the job resumes from its newest "
            "checkpoint) or --launch.max-restarts 0"
        )


def ps_node_bytes(cfg: PSJobConfig, per_node: int) -> int:
    """Host memory of the fullest node beyond its processes' base (the module's docstring says what it counts)."""
    from disttrain.ps.plan import server_bytes

    ps = cfg.ps
    shards = [b for _, b in server_bytes(ps)]
    cache = 0
    if ps.cache_rows:  # per table: counts, flags and slots per row; values and summed gradients per cached row
        cache = sum(rows * 13 + min(ps.cache_rows, rows) * (2 * ps.dim * 4 + 16) for rows in ps.tables)

    def rank_bytes(r: int) -> int:
        held = cache if r < ps.trainers else 0
        if ps.colocated:
            return held + 2 * shards[r]
        if r >= ps.trainers:
            s = r - ps.trainers
            held += 2 * (shards[s] if s < ps.servers else max(shards))
        return held

    nodes = ps.processes // per_node
    return max(sum(rank_bytes(r) for r in range(n * per_node, (n + 1) * per_node)) for n in range(nodes))


def write_ps_manifest(cfg: PSJobConfig, kind: str) -> int:
    """``disttrain ps --k8s KIND``: the trainers and servers spread over ``launch.nnodes`` pods."""
    from disttrain.jobs.ps import ps_procs_per_node

    check_k8s(cfg.k8s, cfg.launch.nnodes)
    nproc = ps_procs_per_node(cfg)  # MIN:MAX or an uneven split: one line (RPC groups are fixed)
    if cfg.ps.watched:
        fixed_group_restarts(kind, cfg.launch.max_restarts, "disttrain ps with spare servers or asp trainers")
    # torchrun's agents take a restarted pod back; the watched path cannot
    return _write_rpc_pods(cfg, kind, "ps", nproc, ps_node_bytes(cfg, nproc), pod_restarts=not cfg.ps.watched)


def _write_rpc_pods(
    cfg: PSJobConfig | RLJobConfig, kind: str, command: str, nproc: int, host: int, pod_restarts: bool
) -> int:
    """The pods of an RPC job (``command``: ps or rl) on CPUs: ``host`` bytes per node besides the processes,
    /dev/shm for RPC's shared-memory transport, the job's config in the ConfigMap."""
    res = pod_resources(
        cfg.k8s,
        nproc=nproc,
        device="cpu",
        preempt_grace_s=cfg.launch.preempt_grace_s,
        host_bytes=host,
        shm_per_process=RPC_SHM_PER_PROCESS,
    )
    name = job_name(cfg.run.name)
    return write_pods(
        kind,
        cfg.k8s,
        cfg.launch,
        name=name,
        args=[command, "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        nproc=nproc,
        res=res,
        path=Path(cfg.run.root) / f"{name}.{kind}.yaml",
        config_toml=to_toml(pod_config(cfg, name, cfg.k8s, res)),
        pod_restarts=pod_restarts,
    )


def replay_bytes(cfg: RLJobConfig, spec: EnvSpec) -> int:
    """The learner's replay: capacity x one transition, and the priorities' sum tree (0 for reinforce)."""
    rl = cfg.rl
    if rl.algo != "dqn":
        return 0
    capacity = rl.capacity_for(spec.image)
    obs = spec.obs_dim * (1 if spec.obs_dtype == "uint8" else 4)
    tree = 2 * (1 << (capacity - 1).bit_length()) * 8 if rl.prioritized else 0  # float64 nodes
    return capacity * (2 * obs + TRANSITION_SCALARS) + tree


def write_rl_manifest(cfg: RLJobConfig, kind: str) -> int:
    """``disttrain rl --k8s KIND``: the learner and actors spread over ``launch.nnodes`` pods (the learner on
    node 0, which hosts the RPC group's store at the rendezvous)."""
    from disttrain.jobs.rl import processes, world_size
    from disttrain.launch.direct import per_node
    from disttrain.rl.envs import env_spec
    from disttrain.rl.nets import check_algo

    check_k8s(cfg.k8s, cfg.launch.nnodes)
    rl = cfg.rl
    nproc = per_node(world_size(cfg), cfg.launch.nnodes, processes(cfg))  # MIN:MAX or uneven: one line
    fixed_group_restarts(kind, cfg.launch.max_restarts, "disttrain rl")
    spec = env_spec(rl.env_id)  # an unknown id or an unsupported space: one line, as the job itself says it
    check_algo(spec, rl.algo)
    # the launcher starts the RPC group itself: a restarted pod alone cannot rejoin it
    return _write_rpc_pods(cfg, kind, "rl", nproc, 2 * replay_bytes(cfg, spec), pod_restarts=False)
