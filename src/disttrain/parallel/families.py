"""Model families: what ``parallelize`` does differently for each kind of model, and nothing else (torchtitan keeps
a ``parallelize.py`` per model; here the order is one, :data:`disttrain.parallel.parallelize.ORDER`, and a family
says where a model departs from it).

A family today differs in its tensor-parallel plan and in what that plan can do: the built-in GPT (Megatron's
split, sequence parallel, loss parallel over vocabulary shards), Hugging Face GPT-2 (disttrain's plan for its
Conv1D layers), Hugging Face decoders that carry a plan in their config (``base_model_tp_plan``: Llama, Qwen,
Mistral, ...), and any other module (a plan only from ``--model.tp-plan``). The blocks FSDP wraps, activation
checkpointing and compile treat every family alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from disttrain.build import hf_models
from disttrain.errors import ConfigError
from disttrain.models.gpt import GPT
from disttrain.parallel.tp_gpt2 import is_gpt2
from disttrain.parallel.tp_plans import TPPlan, gpt_plan, hf_plan, user_plan

PlanBuilder = Callable[[nn.Module, bool, bool], TPPlan | None]
"""(model, loss_parallel, sequence_parallel) -> the family's built-in tensor-parallel plan."""


@dataclass(frozen=True)
class Family:
    name: str
    plan: PlanBuilder | None
    """The built-in tensor-parallel plan; None: the user names one (``--model.tp-plan pkg.mod:fn``)."""
    loss_parallel: bool = False
    """Its plan can keep the logits sharded over the vocabulary (cross-entropy on the shards)."""
    sequence_parallel: bool = False
    """Its plan runs the norms on sequence shards between the matmuls."""

    def describe_tp(self, spec: str, loss_parallel: bool, sequence_parallel: bool) -> str:
        """'the gpt plan, sequence parallel, loss parallel': the plan a TP split uses and what of it is on."""
        if spec != "auto":
            return f"the plan of {spec}"
        parts = [f"the {self.name} plan"]
        parts += ["sequence parallel"] if sequence_parallel and self.sequence_parallel else []
        parts += ["loss parallel"] if loss_parallel and self.loss_parallel else []
        return ", ".join(parts)


def _gpt(model: nn.Module, loss_parallel: bool, sequence_parallel: bool) -> TPPlan:
    assert isinstance(model, GPT)
    return gpt_plan(model, loss_parallel, sequence_parallel)


def _hf(model: nn.Module, loss_parallel: bool, sequence_parallel: bool) -> TPPlan | None:
    return hf_plan(model)  # the config's plan: replicated norms, gathered logits


GPT_FAMILY = Family("gpt", _gpt, loss_parallel=True, sequence_parallel=True)
HF_GPT2 = Family("hf-gpt2", _hf)
HF_DECODER = Family("hf-decoder", _hf)
MODULE = Family("module", None)


def family_of(model: nn.Module) -> Family:
    """The family ``model`` belongs to (a wrapper around a Hugging Face model is that model's family)."""
    if isinstance(model, GPT):
        return GPT_FAMILY
    for hf in hf_models(model):
        if is_gpt2(hf):
            return HF_GPT2
        if getattr(getattr(hf, "config", None), "base_model_tp_plan", None):
            return HF_DECODER
    return MODULE


def plan_for(model: nn.Module, spec: str, loss_parallel: bool, sequence_parallel: bool = True) -> TPPlan:
    """The plan ``model.tp_plan`` names (auto: the model family's own), or a ConfigError."""
    if spec != "auto":
        return user_plan(spec, model)
    family = family_of(model)
    plan = family.plan(model, loss_parallel, sequence_parallel) if family.plan else None
    if plan is None:
        raise ConfigError(
            f"parallel.tp > 1, but there is no tensor-parallel plan for {type(model).__name__} (plans are built in "
            "for the GPT, Hugging Face GPT-2 and Hugging Face models with a base_model_tp_plan); "
            "pass --model.tp-plan pkg.mod:fn "
            "(fn(model) -> {module path: 'colwise' | 'rowwise' | ParallelStyle}), or use --parallel.tp 1"
        )
    return plan
