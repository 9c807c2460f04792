"""The loop's guards and guarantees, in one process: non-finite steps are skipped and counted, the same seed
gives the same losses, fp16 trains with loss scaling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from disttrain.config import from_dict
from disttrain.data.text import load_text_data
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.train.loss import cross_entropy
from disttrain.train.trainer import Trainer

pytestmark = pytest.mark.timeout(120)


def make(small_text: Path, steps: int = 8, seed: int = 7, dtype: str = "fp32", **train: object) -> Trainer:
    cfg = from_dict(
        {
            "model": {"context": 32},
            "data": {"path": str(small_text)},
            "train": {"steps": steps, "global_batch": 8, "micro_batch": 8, "eval_interval": 0, "seed": seed, **train},
            "optim": {"warmup_steps": 2},
            "parallel": {"strategy": "single", "device": "cpu"},
            "precision": {"dtype": dtype},
            "metrics": {"progress": "off", "peak_tflops": 1.0},
        }
    )
    text = load_text_data(str(small_text), 32, 0.1)
    model = GPT(GPTConfig(text.tokenizer.vocab_size, n_layers=1, d_model=32, n_heads=2, context=32), seed=seed)
    return Trainer(model, text.train, cfg)


def test_nonfinite_loss_skips_the_step_and_counts_it(small_text: Path) -> None:
    trainer = make(small_text)
    calls = {"n": 0}

    def poisoned(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        loss = cross_entropy(logits, targets)
        return loss * float("nan") if calls["n"] == 4 else loss

    trainer.loss_fn = poisoned
    for _ in range(3):
        trainer.train_step()
    before = {k: v.clone() for k, v in trainer.model.module.state_dict().items()}
    loss, _, stepped = trainer.train_step()
    assert not stepped and loss != loss and trainer.skipped == 1
    after = trainer.model.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step must not touch the weights"
    assert all(p.grad is None for p in trainer.model.parameters()), "its gradients are dropped"
    loss, _, stepped = trainer.train_step()
    assert stepped and loss == loss and trainer.skipped == 1


def test_nonfinite_guard_can_be_turned_off(small_text: Path) -> None:
    trainer = make(small_text, skip_nonfinite=False)
    trainer.loss_fn = lambda lo, t: cross_entropy(lo, t) * float("inf")
    _, _, stepped = trainer.train_step()
    assert not stepped and trainer.skipped == 0  # the step ran (and the user asked for that)


def test_same_seed_same_losses_other_seed_other_losses(small_text: Path) -> None:
    a = make(small_text).fit().losses
    b = make(small_text).fit().losses
    c = make(small_text, seed=8).fit().losses
    assert a == b
    assert a != c


def test_fp16_trains_with_a_grad_scaler(small_text: Path) -> None:
    trainer = make(small_text, steps=30, dtype="fp16")
    assert trainer.scaler is not None
    res = trainer.fit()
    assert res.losses[-1] < res.losses[0] - 0.5
    assert make(small_text, dtype="bf16").scaler is None
