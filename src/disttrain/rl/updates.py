"""The learner's two updates (double DQN on a replay sample, REINFORCE on whole episodes) and the target network's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def td_errors(net: nn.Module, target: nn.Module, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q(s, a), its double-DQN target): the online network picks the next action, the target network
    values it; ``discount`` is g^k of the n-step return the actor folded, ``done`` stops the bootstrap."""
    q = net(b["obs"]).gather(1, b["action"].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        best = net(b["next_obs"]).argmax(dim=1, keepdim=True)
        q_next = target(b["next_obs"]).gather(1, best).squeeze(1)
        y = b["reward"] + b["discount"] * (1.0 - b["done"]) * q_next
    return q, y


def dqn_step(
    net: nn.Module,
    target: nn.Module,
    opt: torch.optim.Optimizer,
    b: dict[str, torch.Tensor],
    weights: torch.Tensor,
    clip: float = 10.0,
) -> tuple[float, torch.Tensor]:
    """One update on batch ``b`` with importance weights ``weights``; (loss, |TD error| per sample)."""
    q, y = td_errors(net, target, b)
    loss = (weights * F.smooth_l1_loss(q, y, reduction="none")).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(net.parameters(), clip, foreach=True)  # one kernel per step, not one per tensor
    opt.step()
    return float(loss.detach()), (y - q).detach().abs()


@torch.no_grad()
def priorities(net: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """|TD error| of fresh transitions under one network (the Ape-X actor's initial priorities)."""
    q, y = td_errors(net, net, b)
    return (y - q).abs()


def returns_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    out = torch.empty_like(rewards)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + gamma * acc
        out[t] = acc
    return out


def reinforce_step(
    net: nn.Module, opt: torch.optim.Optimizer, episodes: list[dict[str, torch.Tensor]], gamma: float
) -> float:
    """The tutorial's policy gradient: -log pi(a|s) x the normalised discounted return, over every step of
    ``episodes``; the loss."""
    obs = torch.cat([e["obs"] for e in episodes])
    actions = torch.cat([e["action"] for e in episodes])
    g = torch.cat([returns_to_go(e["reward"], gamma) for e in episodes])
    g = (g - g.mean()) / (g.std() + 1e-8) if len(g) > 1 else g - g.mean()
    logp = torch.log_softmax(net(obs), dim=1).gather(1, actions.unsqueeze(1)).squeeze(1)
    loss = -(logp * g).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


@torch.no_grad()
def follow(target: nn.Module, net: nn.Module, tau: float, *, every: int, step: int) -> None:
    """The target network after update ``step``: ``net``'s copy every ``every`` updates (``tau`` 1), else moved
    ``tau`` of the way to ``net`` (Polyak averaging)."""
    if tau >= 1.0:
        if step % every == 0:
            target.load_state_dict(net.state_dict())
        return
    torch._foreach_lerp_(list(target.parameters()), list(net.parameters()), tau)
