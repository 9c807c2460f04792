"""Experience replay: the ring buffer's wrap-around, uniform and prioritized sampling, the sum tree, and
an exact save/restore."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from disttrain.rl.replay import ReplayBuffer, SumTree

pytestmark = pytest.mark.timeout(60)


def chunk(start: int, n: int, obs_dim: int = 3) -> dict[str, torch.Tensor]:
    """Transitions numbered start..start+n-1; every field encodes the number, so a slot's content says which
    transition it holds."""
    t = torch.arange(start, start + n)
    return {
        "obs": t[:, None].float().repeat(1, obs_dim),
        "action": t % 4,
        "reward": t.float(),
        "next_obs": (t[:, None].float() + 0.5).repeat(1, obs_dim),
        "done": (t % 2).float(),
        "discount": torch.full((n,), 0.99**3),
    }


def frequencies(buf: ReplayBuffer, slots: int, draws: int, batch: int = 128) -> torch.Tensor:
    counts = torch.zeros(slots, dtype=torch.float64)
    for _ in range(draws // batch):
        _, idx, _ = buf.sample(batch)
        counts += torch.bincount(idx, minlength=slots)[:slots].double()
    return counts / counts.sum()


def test_the_ring_keeps_the_newest_transitions_and_caps_its_length() -> None:
    buf = ReplayBuffer(5, 3)
    assert (len(buf), buf.capacity, buf.added) == (0, 5, 0)
    start = 0
    for n in (3, 4, 12, 1, 0):
        buf.add(chunk(start, n))
        start += n
        assert len(buf) == min(start, 5) and buf.added == start
        newest = list(range(max(0, start - 5), start))
        assert sorted(buf.storage["reward"][: len(buf)].long().tolist()) == newest  # oldest overwritten
        for t in newest:  # transition t sits in slot t % 5, every field of it
            slot = t % 5
            assert buf.storage["obs"][slot].tolist() == [float(t)] * 3
            assert buf.storage["next_obs"][slot].tolist() == [t + 0.5] * 3
            assert int(buf.storage["action"][slot]) == t % 4
            assert float(buf.storage["done"][slot]) == t % 2
    assert buf.pos == start % 5
    batch, idx, _ = buf.sample(64)
    assert torch.equal(batch["reward"], buf.storage["reward"][idx])
    assert batch["action"].dtype == torch.int64 and batch["obs"].shape == (64, 3)


def test_uniform_sampling_covers_the_filled_slots_evenly() -> None:
    buf = ReplayBuffer(10, 3, seed=1)
    buf.add(chunk(0, 7))  # 7 of 10 slots filled: the empty ones must never come out
    counts = torch.zeros(10)
    for _ in range(300):
        batch, idx, w = buf.sample(128)
        assert torch.equal(w, torch.ones(128))
        assert torch.equal(batch["reward"], idx.float())  # transition i is in slot i
        counts += torch.bincount(idx, minlength=10).float()
    assert counts[7:].sum() == 0
    expected = counts.sum() / 7
    chi2 = float(((counts[:7] - expected) ** 2 / expected).sum())
    assert chi2 < 22.46  # chi-square, 6 degrees of freedom, p = 0.001
    assert torch.allclose(counts[:7] / counts.sum(), torch.full((7,), 1 / 7), atol=0.01)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_prioritized_sampling_is_proportional_to_priority_to_the_alpha(alpha: float) -> None:
    buf = ReplayBuffer(8, 3, prioritized=True, alpha=alpha, seed=2)
    p = torch.tensor([1.0, 2.0, 3.0, 4.0])
    buf.add(chunk(0, 4), priorities=p)
    freq = frequencies(buf, 8, 40_960)
    target = p**alpha / (p**alpha).sum()
    assert freq[4:].sum() == 0
    assert torch.allclose(freq[:4], target.double(), atol=0.02), (freq, target)
    if alpha == 1.0:
        assert torch.allclose(freq[:4], torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.02)


def test_prioritized_sampling_is_stratified() -> None:
    """One draw per equal segment of the total: n draws over n equal priorities hit every slot once."""
    buf = ReplayBuffer(16, 3, prioritized=True, seed=6)
    buf.add(chunk(0, 16))
    for _ in range(20):
        _, idx, w = buf.sample(16)
        assert sorted(idx.tolist()) == list(range(16))
        assert torch.equal(w, torch.ones(16))


def test_importance_weights_follow_the_formula() -> None:
    alpha, beta = 0.7, 0.5
    buf = ReplayBuffer(6, 3, prioritized=True, alpha=alpha, seed=3)
    p = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5])
    buf.add(chunk(0, 5), priorities=p)
    for _ in range(5):
        _, idx, w = buf.sample(32, beta=beta)
        prob = (p.double() + 1e-6) ** alpha / ((p.double() + 1e-6) ** alpha).sum()
        expected = (5 * prob[idx]) ** -beta
        assert w.dtype == torch.float32
        assert torch.allclose(w.double(), expected / expected.max(), rtol=1e-6)
        assert float(w.max()) == 1.0
    _, _, w0 = buf.sample(32, beta=0.0)
    assert torch.equal(w0, torch.ones(32))


def test_priority_updates_move_the_sampling_and_set_the_priority_of_new_transitions() -> None:
    buf = ReplayBuffer(8, 3, prioritized=True, alpha=1.0, seed=4)
    buf.add(chunk(0, 4))  # no priorities: the max so far, 1.0
    assert torch.allclose(buf.tree.get(torch.arange(4)), torch.ones(4, dtype=torch.float64))  # type: ignore[union-attr]
    before = frequencies(buf, 8, 12_800)
    assert torch.allclose(before[:4], torch.full((4,), 0.25, dtype=torch.float64), atol=0.02)
    buf.update_priorities(torch.tensor([2, 0]), torch.tensor([-9.0, 0.0], requires_grad=True))  # TD errors
    after = frequencies(buf, 8, 12_800)
    assert after[2] > 0.75 and after[0] < 0.001, after
    assert torch.allclose(after[:4], torch.tensor([0, 1, 9, 1], dtype=torch.float64) / 11, atol=0.02)
    buf.add(chunk(4, 1))  # a new transition gets the largest priority seen: 9 (+ eps)
    assert float(buf.tree.get(torch.tensor([4]))) == pytest.approx(9.0)  # type: ignore[union-attr]
    assert buf.tree.total() == pytest.approx(0 + 1 + 9 + 1 + 9, abs=1e-5)  # type: ignore[union-attr]


def test_priorities_are_stored_as_abs_plus_eps_to_the_alpha() -> None:
    alpha, eps = 0.5, 0.25
    buf = ReplayBuffer(6, 3, prioritized=True, alpha=alpha, eps=eps)
    tree = buf.tree
    assert tree is not None

    def stored(p: list[float]) -> torch.Tensor:
        return (torch.tensor(p, dtype=torch.float64).abs() + eps) ** alpha

    buf.add(chunk(0, 3), priorities=torch.tensor([-1.0, 0.0, 3.0]))  # from the actor
    assert torch.allclose(tree.get(torch.arange(3)), stored([-1.0, 0.0, 3.0]))
    buf.update_priorities(torch.tensor([0, 1]), torch.tensor([2.0, -0.5]))  # from the learner
    assert torch.allclose(tree.get(torch.arange(3)), stored([2.0, -0.5, 3.0]))
    assert buf.max_priority == 3.25
    buf.add(chunk(3, 2))  # no priorities: the max seen, to the alpha
    assert torch.allclose(tree.get(torch.arange(5)), stored([2.0, -0.5, 3.0, 3.0, 3.0]))
    assert tree.total() == pytest.approx(float(stored([2.0, -0.5, 3.0, 3.0, 3.0]).sum()))


@pytest.mark.parametrize("capacity", [1, 7, 1000, 1024])
def test_sum_tree_agrees_with_a_cumsum(capacity: int) -> None:
    gen = torch.Generator().manual_seed(capacity)
    tree = SumTree(capacity)
    ref = torch.zeros(capacity, dtype=torch.float64)
    for _ in range(3):  # overlapping updates with repeated indices: the last write wins
        idx = torch.randint(0, capacity, (max(1, capacity // 2),), generator=gen)
        pri = torch.randint(0, 50, (len(idx),), generator=gen).double() / 4  # exact sums; about 2% zeros
        tree.update(idx, pri)
        for i, v in zip(idx.tolist(), pri.tolist(), strict=True):
            ref[i] = v
        assert torch.equal(tree.get(torch.arange(capacity)), ref)
        assert tree.total() == float(ref.sum())
        if tree.total() == 0:
            continue
        cum = ref.cumsum(0)
        values = torch.cat([torch.rand(2000, generator=gen, dtype=torch.float64) * tree.total(), cum[:-1]])
        values = values[values < tree.total()]  # the boundaries themselves too: they belong to the next leaf
        found = tree.find(values)
        assert torch.equal(found, torch.searchsorted(cum, values, right=True))
        assert bool((ref[found] > 0).all())


def test_sum_tree_on_random_float_priorities() -> None:
    gen = torch.Generator().manual_seed(0)
    tree = SumTree(3000)
    pri = torch.rand(3000, generator=gen, dtype=torch.float64) * torch.rand(3000, generator=gen, dtype=torch.float64)
    tree.update(torch.arange(3000), pri)
    cum = pri.cumsum(0)
    assert tree.total() == pytest.approx(float(cum[-1]), rel=1e-12)
    values = torch.rand(5000, generator=gen, dtype=torch.float64) * tree.total()
    assert torch.equal(tree.find(values), torch.searchsorted(cum, values, right=True))
    past_the_end = torch.tensor([tree.total() * (1 + 1e-9)], dtype=torch.float64)  # as rounding may make it
    assert int(tree.find(past_the_end)) == 2999  # the last leaf with a priority, not a padding one


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("filled", [23, 70])
def test_state_dict_round_trip_restores_storage_and_the_next_samples(
    prioritized: bool, filled: int, tmp_path: Path
) -> None:
    buf = ReplayBuffer(50, 3, prioritized=prioritized, alpha=0.6, seed=5)
    buf.add(chunk(0, filled - 10), priorities=torch.rand(filled - 10) if prioritized else None)
    buf.add(chunk(filled - 10, 10))
    for _ in range(3):  # move the generator and the priorities away from their start
        _, idx, _ = buf.sample(16)
        buf.update_priorities(idx, torch.rand(16) * 5)
    path = tmp_path / "replay.pt"
    torch.save(buf.state_dict(), path)
    fresh = ReplayBuffer(50, 3, prioritized=prioritized, alpha=0.6, seed=99)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    for k, v in buf.storage.items():
        assert torch.equal(fresh.storage[k], v), k
    assert (fresh.pos, len(fresh), fresh.added, fresh.max_priority) == (buf.pos, len(buf), buf.added, buf.max_priority)
    for step in range(4):
        if step == 2:  # and they stay in step through more adds
            for b in (buf, fresh):
                b.add(chunk(100, 7))
        (b1, i1, w1), (b2, i2, w2) = buf.sample(32, beta=0.5), fresh.sample(32, beta=0.5)
        assert torch.equal(i1, i2) and torch.equal(w1, w2)
        assert all(torch.equal(b1[k], b2[k]) for k in b1)
    state = torch.load(path, weights_only=True)  # the generator's state is what makes them agree:
    state["rng"] = torch.Generator().manual_seed(99).get_state()
    other = ReplayBuffer(50, 3, prioritized=prioritized, alpha=0.6)
    other.load_state_dict(state)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    assert not torch.equal(other.sample(32)[1], fresh.sample(32)[1])


def test_a_restored_buffer_must_have_the_same_configuration() -> None:
    buf = ReplayBuffer(10, 3, prioritized=True)
    buf.add(chunk(0, 4))
    state = torch.load(io.BytesIO(_saved(buf)), weights_only=True)
    with pytest.raises(ValueError, match=r"replay: the saved buffer has .*'capacity': 10, .* but this one has"):
        ReplayBuffer(12, 3, prioritized=True).load_state_dict(state)
    with pytest.raises(ValueError, match="prioritized"):
        ReplayBuffer(10, 3).load_state_dict(state)


def _saved(buf: ReplayBuffer) -> bytes:
    out = io.BytesIO()
    torch.save(buf.state_dict(), out)
    return out.getvalue()


def test_mistakes_are_one_line_value_errors() -> None:
    with pytest.raises(ValueError, match="replay: capacity must be >= 1, got 0"):
        ReplayBuffer(0, 3)
    with pytest.raises(ValueError, match=r"replay: alpha must be >= 0, got -0\.5"):
        ReplayBuffer(4, 3, alpha=-0.5)
    with pytest.raises(ValueError, match="replay: the sum tree's capacity must be >= 1"):
        SumTree(0)
    buf = ReplayBuffer(4, 3, prioritized=True)
    with pytest.raises(ValueError, match="replay: cannot sample from an empty buffer"):
        buf.sample(8)
    bad = chunk(0, 2, obs_dim=5)
    with pytest.raises(ValueError, match=r"replay: obs of shape \(2, 5\) does not match obs_dim 3"):
        buf.add(bad)
    with pytest.raises(ValueError, match="the chunk lacks discount"):
        buf.add({k: v for k, v in chunk(0, 2).items() if k != "discount"})
    with pytest.raises(ValueError, match="replay: 3 priorities for 2 transitions"):
        buf.add(chunk(0, 2), priorities=torch.ones(3))
    with pytest.raises(ValueError, match="must be finite"):
        buf.add(chunk(0, 2), priorities=torch.tensor([1.0, float("nan")]))
    assert (len(buf), buf.added, buf.max_priority) == (0, 0, 1.0)  # a rejected chunk leaves no trace
    buf.add(chunk(0, 2))
    with pytest.raises(ValueError, match="outside the 2 filled") as err:
        buf.update_priorities(torch.tensor([3]), torch.ones(1))
    assert "\n" not in str(err.value)
