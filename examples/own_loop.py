# Your own training loop, any strategy: disttrain launch -n 2 examples/own_loop.py
import torch
import torch.nn.functional as F

from disttrain import ParallelConfig, PrecisionConfig, init_distributed, parallelize
from disttrain.models.gpt import GPT, GPTConfig

env = init_distributed()  # joins the group torchrun started (or runs alone)
with torch.device("meta"):  # nothing is allocated: under FSDP each rank materialises only its shard
    model = GPT(GPTConfig(vocab_size=65, n_layers=2, d_model=64, n_heads=4, context=32))
pm = parallelize(
    model,
    ParallelConfig(strategy="fsdp", forward_prefetch=1, backward_prefetch=1),
    PrecisionConfig(dtype="bf16"),  # bf16 compute, fp32 master weights and gradient reduction
)
opt = torch.optim.AdamW(pm.parameters(), lr=3e-3)
accum = 2
torch.manual_seed(env.rank)
for step in range(5):
    for micro in range(accum):
        x = torch.randint(0, 65, (4, 32), device=env.device)
        with pm.sync(micro == accum - 1):  # gradients are reduced on the last micro-step only
            with pm.autocast():
                logits = pm(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), x.roll(-1, 1).flatten())
            (loss / accum).backward()
    grad_norm = pm.clip_grad_norm_(1.0)  # the global norm, not one shard's
    opt.step()
    opt.zero_grad()
    if env.is_main:
        print(f"step {step} loss {loss.item():.3f} grad norm {grad_norm:.3f}")
