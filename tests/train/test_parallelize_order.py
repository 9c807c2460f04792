"""parallelize's one order (pipeline -> TP -> EP -> activation checkpointing -> compile -> data parallel) and the
model families that depart from it only in their tensor-parallel plan: each family found for its models, each
step's record (the pipeline split included), the degrees no step applies yet refused with the step's name, all on
torch's fake process-group backend (one process standing for a rank of 4) and the meta device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from torch import nn

from disttrain.models.gpt import GPT, GPTConfig
from disttrain.parallel.families import GPT_FAMILY, HF_DECODER, HF_GPT2, MODULE, family_of
from disttrain.parallel.parallelize import ORDER
from disttrain.testing.launch import child_env

from conftest import TESTS

pytestmark = pytest.mark.timeout(480)


def test_the_order_is_torchtitans() -> None:
    want = "pipeline, tensor parallel, expert parallel, activation checkpointing, compile, data parallel"
    assert [name for name, _ in ORDER] == want.split(", ")


def test_each_model_has_its_family() -> None:
    hf = pytest.importorskip("hf_models", reason="transformers is a test dependency (make test installs it)")
    assert family_of(GPT(GPTConfig(vocab_size=64, n_layers=2, d_model=64, n_heads=4, context=32))) is GPT_FAMILY
    assert family_of(hf.gpt2()) is HF_GPT2 and family_of(hf.gpt2_wrapped()) is HF_GPT2  # wrapped: still GPT-2
    assert family_of(hf.llama()) is HF_DECODER and family_of(hf.llama_wrapped()) is HF_DECODER
    assert family_of(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))) is MODULE
    assert MODULE.plan is None and GPT_FAMILY.loss_parallel and not HF_DECODER.loss_parallel


STEPS = """
import json, sys, warnings
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from disttrain.config import ParallelConfig
from disttrain.errors import ConfigError
from disttrain.parallel.mesh import ParallelDims
from disttrain.parallel.families import family_of
from disttrain.parallel.parallelize import parallelize
from disttrain.parallel.stages import plan_for_model
from disttrain.models.gpt import GPT, GPTConfig
import hf_models
warnings.simplefilter("ignore")
out = []
for model_name, degrees, settings in json.loads(sys.argv[1]):
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    with torch.device("meta"):
        tiny = GPTConfig(vocab_size=64, n_layers=2, d_model=64, n_heads=4, context=32)
        model = GPT(tiny) if model_name == "gpt" else getattr(hf_models, model_name)()
    try:
        dims = ParallelDims(4, **degrees)
        dims.world_mesh("cpu")  # as the dry run: the meshes on CPU, whatever device parallelize names
        parallel = ParallelConfig(**settings, pp=dims.pp)
        pipeline = plan_for_model(model, family_of(model).name, parallel, 8) if dims.pp > 1 else None
        done = parallelize(model, parallel, dims=dims, device=torch.device("meta"), pipeline=pipeline)
        out.append({"family": done.family, "applied": list(done.applied)})
    except ConfigError as e:
        out.append({"error": str(e)})
    dist.destroy_process_group()
print(json.dumps(out))
"""


def test_each_step_records_what_it_did_in_the_order() -> None:
    pytest.importorskip("transformers", reason="transformers is a test dependency (make test installs it)")
    cases = [
        ("gpt", {"dp_shard": 2, "tp": 2}, {"activation_checkpointing": "full"}),
        ("llama", {"dp_shard": 2, "tp": 2}, {"activation_checkpointing": "2", "loss_parallel": True}),
        ("gpt2", {"dp_shard": 4}, {}),
        ("gpt", {"dp_replicate": 4, "dp_shard": 1, "fsdp": False}, {}),
        ("gpt", {"pp": 2, "dp_shard": 2}, {}),
        ("llama", {"pp": 2, "dp_shard": 2}, {}),
        ("gpt", {"dp_shard": 4, "ep": 2}, {}),
        ("gpt", {"dp_shard": 2, "cp": 2}, {}),
        ("gpt", {"dp_replicate": 4, "dp_shard": 1, "fsdp": False}, {"offload": True}),
    ]
    code = [sys.executable, "-c", STEPS, json.dumps(cases)]
    done = subprocess.run(code, capture_output=True, text=True, timeout=400, env=child_env(TESTS))
    assert done.returncode == 0, done.stderr[-3000:]
    gpt_tp, llama_tp, gpt2, ddp, pp, llama_pp, ep, cp, offload = json.loads(done.stdout)
    assert gpt_tp == {
        "family": "gpt",
        "applied": [
            "tp 2 (the gpt plan, sequence parallel, loss parallel)",
            "activation checkpointing (full: 2 of 2 blocks)",
            "fsdp over dp_shard 2",
        ],
    }
    # the decoder's plan (its config's) keeps the logits whole and the norms replicated: neither is claimed
    assert llama_tp["family"] == "hf-decoder" and llama_tp["applied"][0] == "tp 2 (the hf-decoder plan)"
    assert llama_tp["applied"][1:] == ["activation checkpointing (2: 1 of 2 blocks)", "fsdp over dp_shard 2"]
    assert gpt2 == {"family": "hf-gpt2", "applied": ["fsdp over dp_shard 4"]}
    assert ddp["applied"] == ["ddp over dp_replicate 4"]
    # rank 1 of pp 2 x dp_shard 2 is pipeline rank 0: the first stage, then FSDP over its data-parallel pair
    assert pp == {
        "family": "gpt",
        "applied": ["pp 2 (1f1b, 4 micro-batches; stages: blocks 0 | 1)", "fsdp over dp_shard 2"],
    }
    assert "the hf-decoder family has no stage split yet" in llama_pp["error"]
    assert "has ep 2" in ep["error"] and "expert parallelism" in ep["error"] and "set ep to 1" in ep["error"]
    assert "has cp 2" in cp["error"] and "context parallelism" in cp["error"]
    assert "parallel.offload keeps FSDP's shards in host memory" in offload["error"]
