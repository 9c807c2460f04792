"""How a job is spread over processes and nodes: the parallel and launch sections."""

from __future__ import annotations

import dataclasses
from typing import Literal

from disttrain.config.values import check, parse_bytes


@dataclasses.dataclass
class ParallelConfig:
    """How the model is spread over ranks."""

    strategy: Literal["auto", "single", "ddp", "fsdp", "hsdp"] = "auto"
    """single (one process), ddp, fsdp (FSDP2), hsdp (replicate across nodes x shard within), or auto
    (from the memory plan: ddp while it fits the device, else fsdp, or hsdp across nodes)."""
    nproc: int | None = None
    """Processes on this node (default: one per GPU, or 2 on a CPU machine)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device type (auto: cuda if available)."""
    oversubscribe: bool = False
    """Allow more CPU processes than cores (for trying sharding on a laptop)."""
    replicate: int = -1
    """HSDP replica groups (-1 = the rest: world size / shard; default one per node)."""
    shard: int = -1
    """HSDP shard group size (-1 = the rest; default the ranks of one node)."""
    tp: int = 1
    """Tensor parallel degree: each layer's matmuls split over this many ranks (the innermost mesh dimension,
    within a node); the data-parallel strategy then spans world size / tp ranks. Must divide the world size."""
    pp: int = 1
    """Pipeline stages: the model's blocks split over this many ranks (the outermost mesh dimension, the one to
    put across nodes: only the activations at a stage's edges cross it); the data-parallel strategy then spans
    world size / (pp x tp) ranks. Must divide the world size."""
    pp_schedule: Literal[
        "auto", "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"
    ] = "auto"
    """The pipeline schedule (torch.distributed.pipelining's): gpipe (every forward, then every backward), 1f1b,
    or one with several stages per rank (interleaved-1f1b, looped-bfs, interleaved-zb; zbv and dualpipev: two in
    a V); auto: 1f1b, or interleaved-1f1b with pp_stages_per_rank > 1."""
    pp_microbatches: int = 0
    """Pieces each micro-batch is cut into on its way through the pipeline (more: a smaller bubble, smaller
    messages); 0: auto, 2 x the stages where train.micro_batch divides so. Must divide train.micro_batch."""
    pp_stages_per_rank: int = 0
    """Stages each pipeline rank holds (virtual stages, for the interleaved and V schedules); 0: the
    schedule's own (1, or 2 for the multi-stage ones)."""
    pp_split: str = ""
    """The block indices where stages 1, 2, ... begin, e.g. '3,6' (empty: balanced by the blocks' cost, the
    embeddings counted in the first stage and the head in the last)."""
    sequence_parallel: bool = True
    """With tp > 1, for plans that split the norms (the built-in GPT's): the norms run on sequence shards and the
    activations between the matmuls are split over the sequence (reduce-scatter + all-gather instead of one
    all-reduce: the same bytes, activation memory / tp). False: the norms are replicated."""
    loss_parallel: bool = True
    """With tp > 1 and an output projection split over the vocabulary: cross-entropy over the vocabulary
    shards (the logits are never gathered). False: the logits are gathered on every rank."""
    device_memory: str = "auto"
    """Memory of one device for the plan, e.g. '80GiB' (auto: the GPU's, or host RAM / nproc on CPU)."""
    memory_headroom: float = 0.1
    """Fraction of device memory the plan keeps free (allocator fragmentation, comm buffers)."""
    force: bool = False
    """Run a forced strategy even when the memory plan says it does not fit."""
    init: Literal["auto", "meta", "cpu"] = "auto"
    """How FSDP/HSDP models are built: meta (on the meta device, then each rank initialises only its
    shards: no full copy in memory; the model must say how to initialise itself), cpu (the full model
    on every rank with the same seed, then sharded: any model, one full copy per rank while starting),
    or auto (meta when the model defines init_param, init_weights or is a Hugging Face model, else cpu)."""
    activation_checkpointing: str = "none"
    """Recompute block activations in backward: none, full (every block), or K (every K-th block)."""
    offload: bool = False
    """FSDP/HSDP: keep sharded params, grads and optimizer state in host memory (CPUOffloadPolicy)."""
    shard_modules: str = "auto"
    """What FSDP wraps as one unit: 'auto' (the largest ModuleList), a class name ('Block'),
    or the dotted path of a ModuleList ('transformer.h')."""
    reshard_after_forward: Literal["default", "always", "never"] = "default"
    """Free gathered params after forward: always (ZeRO-3), never (ZeRO-2),
    default (always except the last block, which backward needs at once)."""
    blocks_per_unit: int | Literal["auto"] = "auto"
    """FSDP/HSDP: adjacent blocks sharded together as one unit (one all-gather and one reduce-scatter
    each). auto: from the plan, the fewest blocks whose all-gather is big enough to reach most of the
    link's bandwidth, as long as the gathered unit fits in memory (1 for big blocks)."""
    forward_prefetch: int | Literal["auto"] = "auto"
    """Explicitly all-gather the next K units in forward (0 = FSDP's implicit one-ahead; auto: the depth
    the plan says hides the all-gathers, within memory)."""
    backward_prefetch: int | Literal["auto"] = "auto"
    """Explicitly all-gather the previous K units in backward (0 = implicit; auto: as forward)."""
    root_units: Literal["auto", "one", "split"] = "auto"
    """FSDP/HSDP: what holds the parameters outside the blocks. one: the root unit (gathered for the whole
    step); split: the embeddings (the modules before the blocks) and the final norm + head (after them) in
    units of their own, as torchtitan shards them; auto: split when they hold at least as many parameters as
    the biggest block unit and no parameter is shared between the two sides (a tied head stays in the root)."""
    compile: Literal["auto", "off", "blocks", "model"] = "auto"
    """torch.compile: off, blocks (each block on its own, the FSDP units), or model (the whole model);
    auto: what measured fastest on this kind of device (see docs/performance.md)."""
    ddp_bucket_mb: float = 25.0
    """DDP gradient bucket size in MiB."""
    timeout_s: float = 600.0
    """Collective timeout in seconds (a hang fails with a message after this)."""

    def __post_init__(self) -> None:
        check(self.nproc is None or self.nproc >= 1, f"parallel.nproc must be >= 1, got {self.nproc}")
        for key in ("replicate", "shard"):
            v = getattr(self, key)
            check(v == -1 or v >= 1, f"parallel.{key} must be >= 1, or -1 for the rest; got {v}")
        check(self.tp >= 1, f"parallel.tp must be >= 1 (1 = no tensor parallelism), got {self.tp}")
        check(self.pp >= 1, f"parallel.pp must be >= 1 (1 = no pipeline), got {self.pp}")
        for key in ("pp_microbatches", "pp_stages_per_rank"):
            check(getattr(self, key) >= 0, f"parallel.{key} must be >= 0 (0 = auto), got {getattr(self, key)}")
        check(
            0 <= self.memory_headroom < 1,
            f"parallel.memory_headroom must be in [0, 1), got {self.memory_headroom}; 0.1 keeps 10% free",
        )
        if self.device_memory != "auto":
            parse_bytes(self.device_memory, "parallel.device_memory")
        ac = self.activation_checkpointing
        check(
            ac in ("none", "full") or (ac.isdigit() and int(ac) >= 1),
            f"parallel.activation_checkpointing must be none, full, or K >= 1 (every K-th block), got {ac!r}",
        )
        for key in ("blocks_per_unit", "forward_prefetch", "backward_prefetch"):
            v = getattr(self, key)
            low = 1 if key == "blocks_per_unit" else 0
            check(v == "auto" or v >= low, f"parallel.{key} must be auto or an integer >= {low}, got {v!r}")
        check(self.ddp_bucket_mb > 0, f"parallel.ddp_bucket_mb must be > 0, got {self.ddp_bucket_mb}")
        check(self.timeout_s > 0, f"parallel.timeout_s must be > 0, got {self.timeout_s}")


@dataclasses.dataclass
class LaunchConfig:
    """Processes, nodes and restarts (torchrun semantics)."""

    nnodes: str = "1"
    """Number of nodes, or MIN:MAX for elastic jobs."""
    node_rank: int = 0
    """This node's rank (static rendezvous)."""
    rdzv_endpoint: str | None = None
    """host:port of the rendezvous (multi-node)."""
    max_restarts: int = 0
    """Restart the whole group this many times after a failure."""
    elastic_wait_s: int = 30
    """An elastic job (``nnodes`` MIN:MAX): once MIN nodes have joined a rendezvous round (the start, or a
    restart after a node left), how long it waits for more before the ranks start (torchrun's
    last_call_timeout). Shorter: training goes on sooner after a node is lost; longer: nodes that start late
    are in from the first round instead of joining with a restart."""
    preempt_grace_s: int = 30
    """SIGTERM / SIGUSR1 (preemption): how long the ranks get to finish their step and save a checkpoint
    before the launcher kills them (Slurm's KillWait and Kubernetes' grace period are 30 s by default)."""

    def __post_init__(self) -> None:
        check(self.max_restarts >= 0, f"launch.max_restarts must be >= 0, got {self.max_restarts}")
        check(self.elastic_wait_s >= 1, f"launch.elastic_wait_s must be >= 1 second, got {self.elastic_wait_s}")
        check(self.preempt_grace_s >= 1, f"launch.preempt_grace_s must be >= 1 second, got {self.preempt_grace_s}")
        parts = self.nnodes.split(":")
        check(
            1 <= len(parts) <= 2 and all(p.isdigit() and int(p) >= 1 for p in parts),
            f"launch.nnodes must be N or MIN:MAX with N >= 1, got {self.nnodes!r}",
        )
