"""Which modules of a model are its sharding units (the blocks FSDP wraps one by one): plain module
arithmetic, no FSDP import, so the memory plan can ask it in a launcher that never shards anything."""

from __future__ import annotations

from torch import nn

from disttrain.errors import ConfigError


def find_blocks(model: nn.Module, spec: str = "auto") -> list[nn.Module]:
    """The modules to shard as units: 'auto' = the largest ModuleList, a class name, or a ModuleList path."""
    if spec == "auto":
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
        if isinstance(target, (nn.ModuleList, nn.Sequential)):
            return list(target)
    by_class = [m for m in model.modules() if type(m).__name__ == spec]
    if not by_class:
        classes = sorted({type(m).__name__ for m in model.modules()})
        raise ConfigError(
            f"parallel.shard_modules {spec!r} matches no ModuleList path and no module class; "
            f"classes in this model: {', '.join(classes[:12])}"
        )
    return by_class
