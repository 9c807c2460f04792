"""The model summary printed at the start of a run (:meth:`disttrain.train.trainer.Trainer.train`).

Owns counting a model's parameters (per top-level module, total, trainable, bytes per dtype) and finding its
sharding units: the modules FSDP2's ``fully_shard`` wrapped, each with the parameters it gathers as one and
the number of ranks they are split over (read from the DTensor placements: FSDP = every rank, HSDP = the
shard group). Counts are of the whole model, not one rank's shard: ``numel()`` of a DTensor is its global
size, and a meta-device parameter has its size without storage. A parameter shared by two modules (tied
weights) is counted once, under the first that names it. Plain text, no markup: the console prints it as is.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from disttrain.utils.fmt import fmt_bytes

ROOT = "(root)"
"""The name of the model itself: its own parameters' row, and its unit under FSDP (what no block holds)."""


@dataclass
class ModuleRow:
    """One top-level child module (or the root's own parameters)."""

    name: str
    cls: str
    params: int = 0
    trainable: int = 0


@dataclass
class ShardUnit:
    """One ``fully_shard`` unit: the parameters it owns (not those of units inside it) and their split."""

    name: str
    cls: str
    params: int = 0
    nbytes: int = 0
    ranks: int = 1
    """Ranks each of its parameters is split over (the mesh dimensions its DTensors are sharded on)."""
    replicas: int = 1
    """Copies of that split (HSDP's replica groups: the mesh dimensions its DTensors are replicated on)."""
    members: list[str] = field(default_factory=list)
    """The modules sharded together as this unit (one, unless ``fully_shard`` was given a list)."""


@dataclass
class ModelSummary:
    """The figures of :func:`model_summary`, for callers that want numbers rather than text."""

    cls: str
    rows: list[ModuleRow]
    total: int
    trainable: int
    bytes_by_dtype: dict[str, int]
    units: list[ShardUnit] = field(default_factory=list)
    world_size: int = 1


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside a DDP wrapper (FSDP2 shards in place: nothing to unwrap)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def class_name(module: object) -> str:
    """The module's own class, not FSDP2's ``FSDP<Class>`` subclass."""
    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule)).__name__


def split(p: nn.Parameter) -> tuple[int, int]:
    """(ranks a parameter is split over, copies of that split) from its DTensor placements; (1, 1) otherwise."""
    if not isinstance(p, DTensor):
        return 1, 1
    sizes = [p.device_mesh.size(i) for i in range(p.device_mesh.ndim)]
    shard = math.prod(n for n, pl in zip(sizes, p.placements, strict=True) if pl.is_shard())
    return shard, math.prod(n for n, pl in zip(sizes, p.placements, strict=True) if pl.is_replicate())


def owner(name: str, prefixes: list[str]) -> str | None:
    """The longest of ``prefixes`` (module names, "" = root) that contains parameter ``name``."""
    inside = [m for m in prefixes if m == "" or name.startswith(m + ".")]
    return max(inside, key=len) if inside else None


def summarize(model: nn.Module, world_size: int = 1) -> ModelSummary:
    """Count ``model``'s parameters per top-level child (those with parameters) and find its sharding units."""
    model = unwrap(model)
    params = list(model.named_parameters())  # each shared parameter once
    rows = {name: ModuleRow(name, class_name(child)) for name, child in model.named_children()}
    rows[ROOT] = ModuleRow(ROOT, class_name(model))
    by_dtype: dict[str, int] = defaultdict(int)
    for name, p in params:
        row = rows.get(name.split(".")[0], rows[ROOT])
        row.params += p.numel()
        row.trainable += p.numel() if p.requires_grad else 0
        by_dtype[str(p.dtype).removeprefix("torch.")] += p.numel() * p.element_size()
    kept = [r for r in rows.values() if r.params]
    total, trainable = sum(r.params for r in kept), sum(r.trainable for r in kept)
    units = find_units(model, params)
    return ModelSummary(class_name(model), kept, total, trainable, dict(by_dtype), units, world_size)


def find_units(model: nn.Module, params: list[tuple[str, nn.Parameter]]) -> list[ShardUnit]:
    """The ``fully_shard`` units in definition order, each with the parameters it owns. Modules sharded together
    (``fully_shard`` of a list: ``parallel.blocks_per_unit`` > 1) share one FSDP state and are one unit."""
    by_state: dict[int, ShardUnit] = {}
    unit_of: dict[str, ShardUnit] = {}
    for name, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        state = id(m._get_fsdp_state())
        unit = by_state.setdefault(state, ShardUnit(name or ROOT, class_name(m)))
        unit.members.append(name or ROOT)
        unit_of[name] = unit
    for name, p in params:
        key = owner(name, list(unit_of))
        if key is None:  # outside every unit (a root that was not wrapped)
            continue
        unit = unit_of[key]
        unit.params += p.numel()
        unit.nbytes += p.numel() * p.element_size()
        unit.ranks, unit.replicas = split(p)
    units = list(by_state.values())
    for u in units:
        if len(u.members) > 1:  # blocks.0, blocks.1, blocks.2 sharded together: blocks.0..2, 3 x Block, one unit
            last = u.members[-1].rpartition(".")[2]
            u.name, u.cls = f"{u.members[0]}..{last}", f"{len(u.members)} x {u.cls}, one unit"
    return units[1:] + units[:1] if units and units[0].name == ROOT else units  # the root last: what is left


def table(rows: list[list[str]], numeric: set[int], indent: str = "  ") -> list[str]:
    """Rows of cells as aligned lines: the columns in ``numeric`` right-aligned, the others left."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    cells = [
        [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        for r in rows
    ]
    return [indent + "  ".join(c).rstrip() for c in cells]


def shape(u: ShardUnit) -> tuple[str, int, int, int]:
    return u.cls, u.params, u.ranks, u.replicas


def group_units(units: list[ShardUnit]) -> list[tuple[str, ShardUnit, int]]:
    """Runs of alike units (``blocks.0`` .. ``blocks.5``: same parent, class, size and split) as one line:
    (label, first unit, count)."""
    out: list[tuple[str, ShardUnit, int]] = []
    for u in units:
        if out:
            _, first, n = out[-1]
            parent, _, idx = u.name.rpartition(".")
            fparent, _, fidx = first.name.rpartition(".")
            alike = parent == fparent and shape(u) == shape(first)
            if alike and parent and idx.isdigit() and fidx.isdigit() and int(idx) == int(fidx) + n:
                out[-1] = (f"{first.name}..{idx}", first, n + 1)
                continue
        out.append((u.name, u, 1))
    return out


def render(s: ModelSummary) -> str:
    """The summary as plain text: the per-module table, bytes per dtype, the sharding units."""
    pct = (lambda n: f"{100 * n / s.total:.1f}%") if s.total else (lambda n: "-")
    rows = [["module", "class", "parameters", "trainable", "share"]]
    rows += [[r.name, r.cls, f"{r.params:,}", f"{r.trainable:,}", pct(r.params)] for r in s.rows]
    rows.append(["total", s.cls, f"{s.total:,}", f"{s.trainable:,}", pct(s.total)])
    dtypes = ", ".join(f"{d} {fmt_bytes(n)}" for d, n in sorted(s.bytes_by_dtype.items(), key=lambda kv: -kv[1]))
    lines = [f"model {s.cls}: {s.total:,} parameters ({s.trainable:,} trainable), {dtypes or 'no parameters'}"]
    lines += table(rows, numeric={2, 3, 4})
    if not s.units:
        where = "the one rank" if s.world_size == 1 else f"each of {s.world_size} ranks"
        lines.append(f"sharding units: none ({where} holds every parameter)")
        return "\n".join(lines)
    lines.append(f"sharding units (fully_shard): {len(s.units)}, each gathered whole for its forward/backward")
    urows = [["unit", "class", "parameters", "split over", "per rank"]]
    urows += [unit_row(label, u, n) for label, u, n in group_units(s.units)]
    lines += table(urows, numeric={2, 4})
    return "\n".join(lines)


def unit_row(label: str, u: ShardUnit, n: int) -> list[str]:
    """The cells of ``n`` alike units: name(s), class, parameters, split, bytes each rank holds of one."""
    each = " each" if n > 1 else ""
    where = f"{u.ranks} rank{'s' if u.ranks > 1 else ''}" + (f" x {u.replicas} replicas" if u.replicas > 1 else "")
    cls = f"{n} x {u.cls}" if n > 1 else u.cls
    return [label, cls, f"{u.params:,}{each}", where, fmt_bytes(u.nbytes / u.ranks) + each]


def model_summary(model: nn.Module, world_size: int = 1, tp: int = 1) -> str:
    """The plain-text summary of ``model`` (wrapped or not, on any device, meta included); ``world_size``
    is the number of ranks that each hold a whole copy when the model has no sharding units (DDP); with
    ``tp`` > 1 the ranks that split the layers between them (tensor parallelism) are said too."""
    text = render(summarize(model, world_size // tp))
    if tp > 1:
        what = "each tensor-parallel group" if world_size > tp else "the tensor-parallel group"
        text = text.replace("the one rank holds every parameter", f"{what} holds every parameter")
        text = text.replace("ranks holds every parameter", "tensor-parallel groups holds every parameter")
        text += f"\ntensor parallel: the layers split over groups of {tp} ranks (parallel.tp)"
    return text
