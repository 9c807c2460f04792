"""``parallel.compile``: what auto means, the errors that say the fix, and compiled blocks training like eager ones.

The 2-rank FSDP run with compiled blocks is a variant of the shared fsdp2 launch in test_parity.py. This file's
single-process run compiles the same tiny blocks at the same micro-batch shape first, so that launch finds
the kernels in inductor's on-disk cache instead of compiling them again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from disttrain.errors import ConfigError
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.parallel.blocks import find_blocks
from disttrain.parallel.compile import AUTO, apply_compile, resolve_compile
from disttrain.testing.tiny import tiny_config

from conftest import FP32

pytestmark = pytest.mark.timeout(240)
TINY = GPTConfig(vocab_size=50, n_layers=2, d_model=32, n_heads=4, context=16)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Forget compiled code afterwards: no test sees another's graphs (or failed compiles)."""
    yield
    torch._dynamo.reset()


def test_auto_resolves_per_device_and_explicit_modes_are_kept() -> None:
    assert resolve_compile("auto", "cuda") == "blocks"
    assert resolve_compile("auto", "cpu") == AUTO["cpu"]
    assert resolve_compile("auto", "mps") == "off"
    for mode in ("off", "blocks", "model"):
        assert resolve_compile(mode, "cpu") == mode
    with pytest.raises(ConfigError, match="must be auto, off, blocks or model"):
        resolve_compile("everything", "cpu")


def test_off_leaves_the_model_alone() -> None:
    model = GPT(TINY)
    apply_compile(model, find_blocks(model), "off", "cpu")
    assert all("forward" not in vars(m) for m in model.modules())


def test_configurations_that_cannot_work_are_refused_up_front() -> None:
    model = GPT(TINY)
    with pytest.raises(ConfigError, match=r"use parallel\.compile = 'blocks'"):
        apply_compile(model, find_blocks(model), "model", "cpu", checkpointing="full")
    with pytest.raises(ConfigError, match="finds none in this model"):
        apply_compile(nn.Linear(2, 2), [], "blocks", "cpu")


def test_a_missing_cxx_compiler_says_the_fix() -> None:
    import torch._inductor.config as inductor

    model = GPT(TINY)
    with (
        inductor.patch({"cpp.cxx": ("/nonexistent/c++",)}),
        pytest.raises(ConfigError, match=r"needs a working C\+\+ compiler.*--parallel.compile off"),
    ):
        apply_compile(model, find_blocks(model), "blocks", "cpu")


def test_a_failing_compile_says_the_fix(monkeypatch: pytest.MonkeyPatch, fresh_dynamo: None) -> None:
    def broken_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("no kernels today")

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=broken_backend))
    model = GPT(TINY)
    apply_compile(model, find_blocks(model), "blocks", "cpu")
    x = torch.zeros(2, 8, dtype=torch.long)
    with torch.no_grad():
        model(x)  # evaluation and sampling run the eager forward: nothing is compiled
    with pytest.raises(ConfigError, match=r"torch.compile of block 0 \(Block\) failed.*--parallel.compile off"):
        model(x)


@pytest.mark.slow
def test_compiled_blocks_train_like_eager_ones(small_text: Path, fresh_dynamo: None) -> None:
    """Single process, 2 micro-batches per step (accumulation), 8 steps: compiled == eager within fp32."""
    import torch._inductor.config as inductor
    from torch._dynamo.utils import counters

    from disttrain.build import build_for_training
    from disttrain.config import from_dict
    from disttrain.data.text import load_text_data
    from disttrain.train.trainer import Trainer

    out = {}
    for mode in ("off", "blocks"):
        cfg = from_dict(tiny_config(small_text, parallel={"strategy": "single", "compile": mode}, train={"steps": 8}))
        text = load_text_data(cfg.data.path, cfg.model.context, cfg.data.val_fraction)
        trainer = Trainer(build_for_training(cfg, text.tokenizer.vocab_size, False), text.train, cfg)
        assert trainer.plan.accum_steps == 2
        graphs = counters["stats"]["unique_graphs"]
        with inductor.patch(compile_threads=1):  # compile in this process: no worker pool left behind
            out[mode] = torch.tensor(trainer.fit().losses)
        assert (counters["stats"]["unique_graphs"] > graphs) == (mode == "blocks")
    assert_close(out["blocks"], out["off"], **FP32)
