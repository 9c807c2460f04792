"""ParallelDims: the n-D parallel layout as degrees only, checked once; it builds the world DeviceMesh with named
dimensions and every flattened sub-mesh the code asks for by name (after torchtitan's
``distributed/parallel_dims.py``).

The degrees, outermost first as the world mesh lays them: ``pp`` (pipeline stages), ``dp_replicate`` (replica
groups), ``dp_shard`` (ranks one copy of the model state is sharded over), ``cp`` (context parallel), ``tp``
(tensor parallel, innermost: adjacent ranks). Their product is the world size. ``ep`` (expert parallel) borrows
its ranks from ``dp_shard x cp`` and so does not multiply the world: with ``ep`` > 1 the world mesh splits
``dp_shard`` into ``dp_shard_mod_ep`` (outer: what the experts' parameters are sharded over) and ``dp_shard_in_ep``
(inner), and the ``ep`` mesh flattens ``dp_shard_in_ep x cp`` (torchtitan's dp2ep layout). ``fsdp`` says whether
parameters are sharded with FSDP2 over ``dp_shard`` (replicated over ``dp_replicate``: HSDP) even where ``dp_shard``
is 1 (FSDP on one rank, to offload); without it, ``dp_replicate`` ranks replicate the whole model (DDP).

What to apply follows from the degrees; which :class:`~disttrain.parallel.strategies.Strategy` carries a layout
out is :func:`disttrain.parallel.strategies.for_dims`'s to say, and how a config's strategy name becomes
degrees is :func:`disttrain.parallel.strategies.dims_for`'s (called once, by ``disttrain.resolve``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from disttrain.errors import ConfigError
from disttrain.parallel.env import init_single_process_group

ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The world mesh's dimensions, outermost first (torchtitan's order)."""

EP_ORDER = ("pp", "dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep", "cp", "tp")
"""The world mesh's dimensions with expert parallelism: ``dp_shard`` split in two around the experts' ranks."""

FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),  # the ranks that see different data
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),  # what a loss is averaged over
    "dp_shard_cp": ("dp_shard", "cp"),  # what FSDP shards over
    "ep": ("dp_shard_in_ep", "cp"),  # the ranks one MoE layer's experts are spread over
}
"""Sub-meshes made by flattening world dimensions, by name (``dp_shard`` stands for the two parts it is split into
when the layout has expert parallelism)."""


@dataclass
class ParallelDims:
    """Degrees over ``world_size`` ranks; ``dp_shard = -1`` (or ``dp_replicate = -1``) is "the rest". Checked
    once here: every degree >= 1, the product equal to the world size, ``ep`` dividing ``dp_shard x cp``,
    replication without sharding (DDP) not composed with ``tp``, ``pp``, ``cp`` or ``ep``."""

    world_size: int
    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    fsdp: bool | None = None
    """Parameters are sharded (FSDP2) over ``dp_shard``; None: where ``dp_shard`` > 1."""
    _meshes: dict[str, DeviceMesh] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._fill_the_rest()
        degrees = self.degrees()
        if any(d < 1 for d in degrees.values()) or self.ep < 1:
            raise ConfigError(f"every parallel degree must be >= 1, got {self._said()}")
        if math.prod(degrees.values()) != self.world_size:
            raise ConfigError(
                f"the degrees multiply to {math.prod(degrees.values())} ({self._said()}), but the world size is "
                f"{self.world_size}; set them so their product is {self.world_size}, or dp_shard to -1 (the rest)"
            )
        if not self._ep_fits(self.ep):
            raise ConfigError(
                f"ep ({self.ep}) must divide dp_shard x cp ({self.dp_shard} x {self.cp}) and be a multiple of cp "
                f"({self.cp}): the expert-parallel ranks are borrowed from the sharded data-parallel ones, every "
                f"context-parallel rank among them; ep degrees that fit: {self._ep_choices()}"
            )
        if self.fsdp is None:
            self.fsdp = self.dp_shard > 1
        if not self.fsdp and self.dp_shard > 1:
            raise ConfigError(f"dp_shard ({self.dp_shard}) > 1 shards parameters: it needs fsdp=True")
        if not self.fsdp and self.dp_replicate > 1 and (self.tp, self.pp, self.cp, self.ep) != (1, 1, 1, 1):
            raise ConfigError(
                f"replication without sharding (DDP, dp_replicate {self.dp_replicate}) does not compose with "
                f"{self._others()}; shard over the data-parallel ranks instead (FSDP or HSDP)"
            )

    def _fill_the_rest(self) -> None:
        if self.dp_shard == -1 and self.dp_replicate == -1:
            raise ConfigError("only one of dp_replicate and dp_shard can be -1 (the rest)")
        fixed = self.pp * self.cp * self.tp * (self.dp_replicate if self.dp_shard == -1 else self.dp_shard)
        if -1 in (self.dp_shard, self.dp_replicate):
            if fixed < 1 or self.world_size % fixed:
                raise ConfigError(
                    f"the degrees given ({self._said()}) do not divide the world size ({self.world_size}); "
                    f"degrees that divide it: {divisors(self.world_size)}"
                )
            if self.dp_shard == -1:
                self.dp_shard = self.world_size // fixed
            else:
                self.dp_replicate = self.world_size // fixed

    def degrees(self) -> dict[str, int]:
        """Every dimension of the world mesh and its degree, outermost first."""
        return {name: getattr(self, name) for name in ORDER}

    def degrees_text(self) -> str:
        """'dp_replicate 1 x dp_shard 2 x tp 2': the data-parallel degrees and every other one above 1."""
        return " x ".join(f"{k} {v}" for k, v in self.degrees().items() if v > 1 or k.startswith("dp_"))

    def _ep_choices(self) -> str:
        return ", ".join(str(e) for e in range(1, self.dp_shard * self.cp + 1) if self._ep_fits(e))

    def _ep_fits(self, ep: int) -> bool:
        """``ep`` ranks can be borrowed from ``dp_shard x cp`` (1: no expert parallelism, always)."""
        return ep == 1 or ((self.dp_shard * self.cp) % ep == 0 and ep % self.cp == 0)

    def _said(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in {**self.degrees(), "ep": self.ep}.items())

    def _others(self) -> str:
        return " x ".join(f"{k} {v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep)))

    # -- what the degrees mean ----------------------------------------------------------------------
    @property
    def strategy(self) -> str:
        """The data-parallel layout's name (single, ddp, fsdp, hsdp), for what is printed and recorded."""
        if self.fsdp:
            return "hsdp" if self.dp_replicate > 1 else "fsdp"
        return "ddp" if self.dp_replicate > 1 else "single"

    @property
    def dp_size(self) -> int:
        """Groups of ranks that see different data (``dp_replicate x dp_shard``)."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        """The data-parallel group of global ``rank`` (``cp`` and ``tp`` are inside it, ``pp`` outside)."""
        return (rank // (self.cp * self.tp)) % self.dp_size

    @property
    def replicate(self) -> int:
        """``dp_replicate`` (the name the config and the resolved job use)."""
        return self.dp_replicate

    @property
    def shard(self) -> int:
        """``dp_shard`` (the name the config and the resolved job use)."""
        return self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are sharded (FSDP or HSDP)."""
        return bool(self.fsdp)

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    def describe(self) -> str:
        out = self.strategy
        if self.dp_replicate > 1 and self.fsdp:
            out = f"{self.strategy} ({self.dp_replicate} replicas x {self.dp_shard} shards)"
        extra = "".join(
            f" x {name} {getattr(self, name)}" for name in ("pp", "cp", "tp", "ep") if getattr(self, name) > 1
        )
        return out + extra

    # -- meshes -------------------------------------------------------------------------------------
    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    def mesh_dims(self) -> dict[str, int]:
        """The world mesh's dimensions: every degree > 1, and ``dp_shard`` where parameters are sharded, so that
        FSDP always has its dimension; ``dp_shard`` of size 1 for a lone rank. With ``ep`` > 1, ``dp_shard`` is
        ``dp_shard_mod_ep x dp_shard_in_ep`` (:data:`EP_ORDER`), ``dp_shard_mod_ep`` kept even at 1: the experts'
        FSDP mesh."""
        if self.ep_enabled:
            split = {"dp_shard_mod_ep": self.dp_shard * self.cp // self.ep, "dp_shard_in_ep": self.ep // self.cp}
            sizes = {**self.degrees(), **split}
            return {n: sizes[n] for n in EP_ORDER if sizes[n] > 1 or n == "dp_shard_mod_ep"}
        kept = {n: d for n, d in self.degrees().items() if d > 1 or (self.fsdp and n == "dp_shard")}
        return kept or {"dp_shard": 1}

    def _parts(self, name: str) -> tuple[str, ...]:
        """The world dimensions sub-mesh ``name`` is made of (``dp_shard`` is two of them under ``ep``)."""
        parts = FLATTENED.get(name, (name,))
        if self.ep_enabled:
            split = {"dp_shard": ("dp_shard_mod_ep", "dp_shard_in_ep")}
            parts = tuple(q for p in parts for q in split.get(p, (p,)))
        return parts

    def world_mesh(self, device_type: str) -> DeviceMesh:
        """Every dimension of :meth:`mesh_dims`, built on first use."""
        if "world" not in self._meshes:
            if self.world_size == 1:
                init_single_process_group(device_type)  # a 1-rank mesh (FSDP on one device, to offload)
            dims = self.mesh_dims()
            self._meshes["world"] = init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
        return self._meshes["world"]

    def get_mesh(self, name: str, device_type: str) -> DeviceMesh | None:
        """The sub-mesh ``name``: a world dimension, or one of :data:`FLATTENED` (the dimensions it flattens
        that the world mesh has); None where it has none of them."""
        if name not in self._meshes:
            world = self.world_mesh(device_type)
            present = [p for p in self._parts(name) if p in (world.mesh_dim_names or ())]
            if not present:
                return None
            if len(present) == 1:
                self._meshes[name] = world[present[0]]
            else:
                self._meshes[name] = world[tuple(present)]._flatten(name)
        return self._meshes[name]

    def fsdp_mesh(self, device_type: str) -> DeviceMesh:
        """What FSDP2 shards over: 1-D ``dp_shard_cp``, or 2-D (``dp_replicate``, ``dp_shard_cp``) for HSDP."""
        if not self.fsdp:
            raise ConfigError(f"the layout {self.describe()} shards no parameters: it has no FSDP mesh")
        if "fsdp" not in self._meshes:
            shard = self.get_mesh("dp_shard_cp", device_type)
            assert shard is not None  # mesh_dims keeps dp_shard where fsdp
            if self.dp_replicate > 1:  # 2-D: replica groups x the shard dimension (flattened first where it is
                world = self.world_mesh(device_type)  # several: the 2-D view names it)
                one = "dp_shard" in (world.mesh_dim_names or ()) and self.cp == 1
                self._meshes["fsdp"] = world[("dp_replicate", "dp_shard" if one else "dp_shard_cp")]
            else:
                self._meshes["fsdp"] = shard
        return self._meshes["fsdp"]

    def ep_mesh(self, device_type: str) -> DeviceMesh:
        """The 1-D mesh of this rank's expert-parallel group (``dp_shard_in_ep x cp``)."""
        mesh = self.get_mesh("ep", device_type) if self.ep_enabled else None
        if mesh is None:
            raise ConfigError("the layout has no expert-parallel dimension (ep 1)")
        return mesh

    def expert_fsdp_mesh(self, device_type: str) -> DeviceMesh:
        """What the experts' parameters are sharded over: the data-parallel ranks outside this rank's expert group
        (``dp_shard_mod_ep``, with ``dp_replicate`` as HSDP's outer dimension)."""
        if not self.ep_enabled or not self.fsdp:
            raise ConfigError(f"the layout {self.describe()} has no expert-parallel FSDP mesh (it needs ep > 1)")
        world = self.world_mesh(device_type)
        return world[("dp_replicate", "dp_shard_mod_ep")] if self.dp_replicate > 1 else world["dp_shard_mod_ep"]

    def pp_mesh(self, device_type: str) -> DeviceMesh:
        """The 1-D mesh of this rank's pipeline: the ranks holding the other stages of its model copy."""
        mesh = self.get_mesh("pp", device_type)
        if mesh is None:
            raise ConfigError("the layout has no pipeline dimension (pp 1)")
        return mesh

    def pp_rank(self, rank: int) -> int:
        """The pipeline position of global ``rank`` (``pp`` is the outermost dimension)."""
        return rank // (self.world_size // self.pp)

    def tp_mesh(self, device_type: str) -> DeviceMesh:
        """The 1-D mesh of this rank's tensor-parallel group."""
        mesh = self.get_mesh("tp", device_type)
        if mesh is None:
            raise ConfigError("the layout has no tensor-parallel dimension (tp 1)")
        return mesh


def divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_tp(tp: int, world_size: int) -> None:
    """``tp`` divides the world size, or a ConfigError naming both and the degrees that would."""
    if tp < 1 or world_size % tp:
        raise ConfigError(
            f"parallel.tp ({tp}) must divide the world size ({world_size}); use one of {divisors(world_size)}, "
            f"or change --parallel.nproc to a multiple of {tp}"
        )


def check_pp(pp: int, ranks: int) -> None:
    """``pp`` divides the ranks left after tensor parallelism, or a ConfigError naming both and the degrees
    that would."""
    if pp < 1 or ranks % pp:
        raise ConfigError(
            f"parallel.pp ({pp}) must divide the world size / tp ({ranks}): each pipeline stage runs on an equal "
            f"share of the ranks; use one of {divisors(ranks)}, or change --parallel.nproc to a multiple of {pp}"
        )
