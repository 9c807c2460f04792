"""The loop's guards and guarantees, in one process: non-finite steps are skipped and counted, the same seed
gives the same losses, fp16 trains with loss scaling."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from disttrain.train.loss import cross_entropy
from disttrain.train.trainer import Trainer

pytestmark = pytest.mark.timeout(120)
Make = Callable[..., Trainer]


@pytest.fixture
def make(tiny_trainer: Make) -> Make:
    """The tiny trainer with this file's settings: 8 steps, seed 7, 2 warm-up steps."""

    def build(steps: int = 8, seed: int = 7, dtype: str = "fp32", **train: object) -> Trainer:
        return tiny_trainer(
            seed=seed, train={"steps": steps, **train}, optim={"warmup_steps": 2}, precision={"dtype": dtype}
        )

    return build


def test_nonfinite_loss_skips_the_step_and_counts_it(make: Make) -> None:
    trainer = make()
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


def test_nonfinite_guard_can_be_turned_off(make: Make) -> None:
    trainer = make(skip_nonfinite=False)
    trainer.loss_fn = lambda lo, t: cross_entropy(lo, t) * float("inf")
    _, _, stepped = trainer.train_step()
    assert not stepped and trainer.skipped == 0  # the step ran (and the user asked for that)


def test_same_seed_same_losses_other_seed_other_losses(make: Make) -> None:
    a = make().fit().losses
    b = make().fit().losses
    c = make(seed=8).fit().losses
    assert a == b
    assert a != c


def test_fp16_trains_with_a_grad_scaler(make: Make) -> None:
    trainer = make(steps=30, dtype="fp16")
    assert trainer.scaler is not None
    res = trainer.fit()
    assert res.losses[-1] < res.losses[0] - 0.5
    assert make(dtype="bf16").scaler is None
