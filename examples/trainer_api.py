# The built-in loop on your own model, dataset and loss: disttrain launch -n 2 examples/trainer_api.py
import torch
from torch.utils.data import Dataset

from disttrain import JobConfig, OptimConfig, ParallelConfig, PrecisionConfig, TrainConfig, Trainer


class Regression(Dataset):
    """y = x @ w + noise: items are (input, target) pairs."""

    def __init__(self, n: int = 4096, dim: int = 32, seed: int = 0) -> None:
        w = torch.randn(dim, 1, generator=torch.Generator().manual_seed(0))  # the same task for every split
        g = torch.Generator().manual_seed(seed + 1)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ w + 0.01 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
config = JobConfig(
    train=TrainConfig(steps=60, global_batch=64, micro_batch=16, eval_interval=30, generate_chars=0),
    optim=OptimConfig(lr=1e-2, warmup_steps=5, weight_decay=0.0, grad_clip=0.0),
    parallel=ParallelConfig(strategy="ddp"),
    precision=PrecisionConfig(dtype="fp32"),
)
trainer = Trainer(model, Regression(), config, loss_fn=torch.nn.functional.mse_loss, val_data=Regression(512, seed=1))
result = trainer.fit()  # every rank gets the same result
if trainer.env.is_main:
    print(f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.4f}, validation {result.val_losses[60]:.4f}")
