"""Which modules of a model are its sharding units (the blocks FSDP wraps one by one): plain module
arithmetic, no FSDP import, so the memory plan can ask it in a launcher that never shards anything."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from disttrain.errors import ConfigError


class StageBlocks(nn.ModuleDict):
    """The blocks a pipeline stage keeps, keyed by their index in the whole model (so their parameters keep
    their names); iterated like the ModuleList they came from: the blocks, in order."""

    def __iter__(self) -> Iterator[nn.Module]:  # type: ignore[override]
        return iter(self.values())


def find_blocks(model: nn.Module, spec: str = "auto") -> list[nn.Module]:
    """The modules to shard as units: 'auto' = the largest ModuleList, a class name, or a ModuleList path."""
    if spec == "auto":
        stage = [m for m in model.modules() if isinstance(m, StageBlocks)]
        if stage:  # a pipeline stage's blocks, however few
            return [b for b in stage[0] if any(True for _ in b.parameters())]
        lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1]
        if not lists:
            return []
        best = max(lists, key=lambda m: (isinstance(m, nn.ModuleList), sum(p.numel() for p in m.parameters())))
        return [b for b in best if any(True for _ in b.parameters())]
    if "." in spec or hasattr(model, spec):
        try:
            target = model.get_submodule(spec)
        except AttributeError:
            target = None
        if isinstance(target, (nn.ModuleList, nn.Sequential, StageBlocks)):
            return list(target)
    by_class = [m for m in model.modules() if type(m).__name__ == spec]
    if not by_class:
        classes = sorted({type(m).__name__ for m in model.modules()})
        raise ConfigError(
            f"parallel.shard_modules {spec!r} matches no ModuleList path and no module class; "
            f"classes in this model: {', '.join(classes[:12])}"
        )
    return by_class


def outer_units(model: nn.Module, blocks: list[nn.Module]) -> tuple[list[nn.Module], list[nn.Module]]:
    """The modules outside the blocks that hold parameters of their own, split into those registered before
    the first block (embeddings) and after the last (final norm, output head), as torchtitan shards them:
    ``([], [])`` where they cannot be units of their own (no blocks, a module between blocks, or a parameter
    shared by both sides, such as an embedding tied to the head, which must stay in the root unit)."""
    if not blocks:
        return [], []
    inside = {id(m) for b in blocks for m in b.modules()}
    above = {id(m) for b in blocks for m in _ancestors(model, b)}
    before: list[nn.Module] = []
    after: list[nn.Module] = []
    seen_block = 0
    for m in model.modules():
        if id(m) in inside:
            seen_block += m in blocks
            continue
        if id(m) in above or not any(True for _ in m.parameters(recurse=False)):
            continue
        if 0 < seen_block < len(blocks):
            return [], []
        (before if seen_block == 0 else after).append(m)
    shared = {id(p) for m in before for p in m.parameters()} & {id(p) for m in after for p in m.parameters()}
    return ([], []) if shared else (before, after)


def _ancestors(model: nn.Module, target: nn.Module) -> list[nn.Module]:
    """The modules on the path from ``model`` down to ``target`` (both included)."""
    for name, m in model.named_modules():
        if m is target:
            path = [model]
            for part in name.split(".") if name else []:
                path.append(getattr(path[-1], part))
            return path
    return []


def split_root(setting: str, outer_numel: int, biggest_unit_numel: int) -> bool:
    """Whether the embeddings and the head get FSDP units of their own (``parallel.root_units``): always for
    'split', never for 'one'; for 'auto' when they hold at least as many parameters as the biggest block unit
    (a big vocabulary: the root unit would otherwise keep them gathered for the whole step)."""
    if setting != "auto":
        return setting == "split"
    return outer_numel > 0 and outer_numel >= biggest_unit_numel
