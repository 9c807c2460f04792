"""ParallelDims, the n-D layout: every valid combination of degrees up to 8 ranks, a table of invalid ones (each a
ConfigError naming the degrees), and the meshes it builds, on torch's fake process-group backend (one process
standing for any rank of any world)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections import Counter

import pytest

from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.mesh import ORDER, ParallelDims


def valid_layouts(max_world: int = 8) -> list[dict[str, int | bool]]:
    """Every (world, pp, dp_replicate, dp_shard, cp, tp, ep, fsdp) the rules admit, up to ``max_world`` ranks."""
    out: list[dict[str, int | bool]] = []
    for world in range(1, max_world + 1):
        for pp, rep, shard, cp, tp in itertools.product(range(1, world + 1), repeat=5):
            if pp * rep * shard * cp * tp != world:
                continue
            for fsdp, ep in itertools.product((False, True), range(1, shard * cp + 1)):
                borrowed = (shard * cp) % ep == 0 and (ep == 1 or ep % cp == 0)
                if not borrowed or (not fsdp and (shard > 1 or (rep > 1 and (tp, pp, cp, ep) != (1,) * 4))):
                    continue
                out.append({"world": world, "pp": pp, "dp_replicate": rep, "dp_shard": shard, "cp": cp, "tp": tp})
                out[-1].update(ep=ep, fsdp=fsdp)
    return out


def build(layout: dict[str, int | bool]) -> ParallelDims:
    kw = {k: v for k, v in layout.items() if k != "world"}
    return ParallelDims(int(layout["world"]), **kw)  # type: ignore[arg-type]


def test_every_valid_combination_up_to_8_ranks() -> None:
    layouts = valid_layouts()
    # pp x dp_replicate x dp_shard x cp x tp (x ep, fsdp) over 1..8 ranks; ep > 1 a multiple of cp (torchtitan's)
    assert len(layouts) == 234
    hsdp_tp = {"world": 8, "pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2, "ep": 2, "fsdp": True}
    assert hsdp_tp in layouts and {**hsdp_tp, "fsdp": False} not in layouts
    for lay in layouts:
        dims = build(lay)
        world = int(lay["world"])
        assert math.prod(dims.degrees().values()) == world and list(dims.degrees()) == list(ORDER)
        assert math.prod(dims.mesh_dims().values()) == world, lay
        assert dims.dp_size == dims.dp_replicate * dims.dp_shard
        # every data-parallel group holds the same number of ranks: pp x cp x tp of them
        groups = Counter(dims.dp_rank(r) for r in range(world))
        assert sorted(groups) == list(range(dims.dp_size)) and set(groups.values()) == {world // dims.dp_size}, lay
        assert strategies.for_dims(dims).name == dims.strategy
        for name in ("pp", "cp", "tp", "ep"):
            assert (f"{name} {getattr(dims, name)}" in dims.describe()) == (getattr(dims, name) > 1), lay


def test_the_rest_is_filled_in() -> None:
    assert ParallelDims(8, tp=2).degrees() == {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 2}
    assert ParallelDims(16, dp_replicate=-1, dp_shard=4, pp=2).dp_replicate == 2
    assert ParallelDims(8).fsdp and not ParallelDims(1).fsdp and ParallelDims(1, fsdp=True).fsdp


INVALID = [
    (dict(world_size=8, dp_shard=3), "the degrees multiply to 3 (pp 1, dp_replicate 1, dp_shard 3, cp 1, tp 1"),
    (dict(world_size=8, tp=3), "the degrees given (pp 1, dp_replicate 1, dp_shard -1, cp 1, tp 3, ep 1) do not divide"),
    (dict(world_size=8, dp_replicate=-1, dp_shard=-1), "only one of dp_replicate and dp_shard can be -1"),
    (dict(world_size=4, tp=0, dp_shard=4), "every parallel degree must be >= 1, got pp 1, dp_replicate 1, dp_shard 4"),
    (dict(world_size=8, dp_shard=4, ep=3, tp=2), "ep (3) must divide dp_shard x cp (4 x 1)"),
    (dict(world_size=8, dp_shard=2, cp=4, ep=2), "be a multiple of cp (4): the expert-parallel ranks"),
    (dict(world_size=8, dp_shard=2, cp=2, ep=3, tp=2), "ep degrees that fit: 1, 2, 4"),
    (dict(world_size=4, dp_shard=4, fsdp=False), "dp_shard (4) > 1 shards parameters: it needs fsdp=True"),
    (dict(world_size=4, dp_replicate=2, dp_shard=1, tp=2), "replication without sharding (DDP, dp_replicate 2)"),
    (dict(world_size=4, dp_replicate=2, dp_shard=1, pp=2), "does not compose with tp 1 x pp 2 x cp 1 x ep 1"),
    (dict(world_size=6, dp_replicate=4, dp_shard=-1), "degrees that divide it: 1, 2, 3, 6"),
]


@pytest.mark.parametrize(("kw", "words"), INVALID)
def test_an_invalid_layout_names_its_degrees(kw: dict[str, int], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        ParallelDims(**kw)  # type: ignore[arg-type]
    assert words in str(e.value), str(e.value)


def test_strategy_names_become_degrees_once() -> None:
    assert strategies.dims_for("ddp", 4).degrees()["dp_replicate"] == 4
    assert strategies.dims_for("hsdp", 8, local_world_size=4).describe() == "hsdp (2 replicas x 4 shards)"
    assert strategies.dims_for("fsdp", 8, tp=2).describe() == "fsdp x tp 2"
    assert strategies.dims_for("fsdp", 1).fsdp  # FSDP on one rank (to offload): sharded over a mesh of one
    assert strategies.for_dims(strategies.dims_for("fsdp", 4, replicate=2)).name == "hsdp"


MESHES = """
import json, sys, warnings
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from disttrain.parallel.mesh import ParallelDims
warnings.simplefilter("ignore")
out = []
for kw in json.loads(sys.argv[1]):
    world = kw.pop("world")
    for rank in (0, world - 1):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        d = ParallelDims(world, **kw)
        row = {"names": list(d.world_mesh("cpu").mesh_dim_names), "shape": list(d.world_mesh("cpu").shape)}
        row["dp"] = [d.get_mesh("dp", "cpu").size(), d.get_mesh("dp", "cpu").get_local_rank(), d.dp_rank(rank)]
        if d.fsdp:
            row["fsdp"] = list(d.fsdp_mesh("cpu").shape)
        if d.tp > 1:
            row["tp"] = d.tp_mesh("cpu").size()
        if d.ep > 1:  # this rank's expert group and the experts' FSDP group (global ranks), the dense FSDP group
            row["ep"] = d.ep_mesh("cpu").mesh.flatten().tolist()
            row["efsdp"] = d.expert_fsdp_mesh("cpu").mesh.tolist()
            row["fsdp_ranks"] = d.fsdp_mesh("cpu").mesh.tolist()
        out.append(row)
        dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
def test_the_meshes_have_the_degrees_on_any_rank() -> None:
    """On the fake backend, rank 0 and the last rank of 8: the world mesh's named dimensions, the flattened
    data-parallel mesh (its size, and this rank's place in it is dp_rank), FSDP's 1-D or 2-D mesh, TP's."""
    layouts = [
        {"world": 8, "dp_shard": 4, "tp": 2},
        {"world": 8, "dp_replicate": 2, "dp_shard": 2, "tp": 2},
        {"world": 8, "pp": 2, "dp_shard": 2, "tp": 2},
        {"world": 8, "dp_replicate": 8, "dp_shard": 1},
        {"world": 8, "pp": 2, "dp_replicate": 2, "dp_shard": 2},
    ]
    code = [sys.executable, "-c", MESHES, json.dumps(layouts)]
    done = subprocess.run(code, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)
    want_names = [["dp_shard", "tp"], ["dp_replicate", "dp_shard", "tp"], ["pp", "dp_shard", "tp"]]
    want_names += [["dp_replicate"], ["pp", "dp_replicate", "dp_shard"]]
    assert [r["names"] for r in rows[::2]] == want_names
    assert [r["shape"] for r in rows[::2]] == [[4, 2], [2, 2, 2], [2, 2, 2], [8], [2, 2, 2]]
    assert [r["dp"][0] for r in rows] == [4, 4, 4, 4, 2, 2, 8, 8, 4, 4]
    assert all(r["dp"][1] == r["dp"][2] for r in rows), rows  # the mesh agrees with dp_rank
    assert [r.get("fsdp") for r in rows[::2]] == [[4], [2, 2], [2], None, [2, 2]]
    assert [r.get("tp") for r in rows[::2]] == [2, 2, 2, None, None]


@pytest.mark.timeout(120)
def test_expert_parallel_borrows_its_ranks_from_the_sharded_ones() -> None:
    """ep splits dp_shard around the experts' ranks (torchtitan's dp2ep): on 8 ranks, ep 4 over dp_shard 8 is
    groups of 4 adjacent ranks, the experts sharded over the 2 ranks that hold the same experts; with cp the ep
    group takes every cp rank; under HSDP the experts' FSDP mesh keeps the replica dimension. The dense FSDP mesh
    stays all of dp_shard x cp, whatever ep."""
    layouts = [
        {"world": 8, "dp_shard": 8, "ep": 4},
        {"world": 8, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 2},
        {"world": 8, "dp_replicate": 2, "dp_shard": 4, "ep": 2},
    ]
    code = [sys.executable, "-c", MESHES, json.dumps(layouts)]
    done = subprocess.run(code, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, last0, rank1, last1, rank2, last2 = json.loads(done.stdout)
    assert rank0["names"] == ["dp_shard_mod_ep", "dp_shard_in_ep"] and rank0["shape"] == [2, 4]
    assert (rank0["ep"], last0["ep"]) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert (rank0["efsdp"], last0["efsdp"]) == ([0, 4], [3, 7])  # the ranks holding the same experts
    assert rank0["fsdp"] == [8] and rank0["dp"][0] == 8 and rank0["fsdp_ranks"] == list(range(8))
    # ep 2 = the cp pair: dp_shard_in_ep is 1 (left out), dp_shard_mod_ep 2; tp innermost
    assert rank1["names"] == ["dp_shard_mod_ep", "cp", "tp"] and rank1["shape"] == [2, 2, 2]
    assert (rank1["ep"], last1["ep"]) == ([0, 2], [5, 7]) and (rank1["efsdp"], last1["efsdp"]) == ([0, 4], [3, 7])
    assert rank1["fsdp"] == [4] and rank1["fsdp_ranks"] == [0, 2, 4, 6]  # dp_shard x cp
    assert rank2["names"] == ["dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep"] and rank2["shape"] == [2, 2, 2]
    assert rank2["fsdp"] == [2, 4] and rank2["fsdp_ranks"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (rank2["ep"], last2["ep"]) == ([0, 1], [6, 7])
    assert rank2["efsdp"] == [[0, 2], [4, 6]] and last2["efsdp"] == [[1, 3], [5, 7]]
    assert rank2["dp"][0] == 8 and all(r["dp"][1] == r["dp"][2] for r in (rank0, last0, rank2, last2))
