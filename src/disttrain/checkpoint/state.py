"""What a checkpoint holds besides the loop's own state: the model and optimizer as DCP state dicts
(``ModelOptimState``), and each rank's random number generator state (``rng_state`` / ``set_rng_state``)."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint import state_dict as _dsd
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from disttrain.parallel.held_order import state_to_defined, state_to_held

IMPLEMENTATION = ("fused", "foreach")
"""Optimizer options that say how it steps, not what it computes: kept from the optimizer a job built."""


class ModelOptimState(Stateful):
    """Model + optimizer as DCP state dicts (sharded under FSDP; FQNs without DDP's ``module.``)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizer = optimizer
        self._info: tuple[tuple[torch.Tensor, ...], Any] | None = None  # (tensors it was made for, info)

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            msd = get_model_state_dict(self.model)
            state_to_defined(self.model, msd)
            return {"model": msd}
        # get_state_dict(model, optimizer), with its analysis of the model kept between saves
        info = self._state_dict_info(self.optimizer)
        msd = _dsd._get_model_state_dict(self.model, info)
        osd = _dsd._get_optim_state_dict(self.model, (self.optimizer,), info)
        _dsd._verify_state_dict(msd, osd, info)
        state_to_defined(self.model, msd, osd)  # in the model's own order, whatever a TP plan holds
        return {"model": msd, "optim": osd}

    def _state_dict_info(self, optimizer: torch.optim.Optimizer) -> Any:
        """What ``get_state_dict`` first works out from the model (every parameter's and buffer's FQN, shared
        parameters, FSDP modules: ~3 ms of the ~8 ms a call takes on the training thread for 250 tensors here),
        made again only when the model's or the optimizer's tensors are not the same objects as last time."""
        tensors = (
            *self.model.parameters(),
            *self.model.buffers(),
            *(p for group in optimizer.param_groups for p in group["params"]),
        )
        cached = self._info
        if cached is not None and len(tensors) == len(cached[0]) and all(map(operator.is_, tensors, cached[0])):
            return cached[1]
        info = _dsd._verify_options(self.model, (optimizer,), optim_only=False)
        self._info = (tensors, info)
        return info

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_to_held(self.model, state_dict["model"], state_dict.get("optim"))
        if self.optimizer is None or "optim" not in state_dict:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(self.model, state_dict["model"])
            return
        # how the optimizer steps (fused, foreach) is this layout's choice, not the saving one's: fused kernels
        # refuse the DTensors of a tensor-parallel model that resumes a single process's checkpoint
        kernels = [{k: g[k] for k in IMPLEMENTATION if k in g} for g in self.optimizer.param_groups]
        self._own_group_members(state_dict["optim"])
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=StateDictOptions(strict=True),
        )
        for group, own in zip(self.optimizer.param_groups, kernels, strict=True):
            group.update(own)

    def _own_group_members(self, osd: dict[str, Any]) -> None:
        """Each param group's member list (FQNs) as this rank's optimizer has it: the saved one is one rank's
        (the lists are written once, under one key), and a pipeline's ranks, or another layout's, hold other
        parameters; the groups' settings are the same on every rank and stay as saved."""
        assert self.optimizer is not None
        info = self._state_dict_info(self.optimizer)
        own: list[dict[str, Any]] = _dsd._get_optim_state_dict(self.model, (self.optimizer,), info)["param_groups"]  # type: ignore[assignment]
        saved = osd.get("param_groups", [])
        if len(saved) == len(own):
            for group, mine in zip(saved, own, strict=True):
                group["params"] = list(mine["params"])


def rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
