"""The parameter server's pieces in one process: row sharding, row-sparse updates, click logs, AUC."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from disttrain.errors import ConfigError
from disttrain.plan.machine import fit_rpc_link
from disttrain.ps.clicks import ClickLog, CriteoFile, auc, parse_criteo_line, read_criteo, write_criteo
from disttrain.ps.config import PSConfig, PSJobConfig
from disttrain.ps.sharding import RowSharding
from disttrain.ps.speed import MESSAGE_BYTES, StepCosts, message_bytes, predict
from disttrain.ps.table import ShardTable


@pytest.mark.parametrize("scheme", ["mod", "range"])
@pytest.mark.parametrize(("rows", "servers"), [(10, 1), (10, 3), (4097, 2), (9, 4)])
def test_shards_partition_the_table_and_every_id_routes_to_one_server(scheme: str, rows: int, servers: int) -> None:
    sh = RowSharding(rows, servers, scheme)
    union = torch.cat([sh.global_ids(s) for s in range(servers)])
    assert sorted(union.tolist()) == list(range(rows))  # every row once, no row twice
    ids = torch.randint(0, rows, (257,))
    parts = sh.split(ids)
    positions = torch.cat([pos for pos, _ in parts])
    assert sorted(positions.tolist()) == list(range(len(ids)))  # every id to exactly one server
    for s, (pos, local) in enumerate(parts):
        assert torch.equal(sh.global_ids(s)[local], ids[pos])  # and to the right row there


def test_bad_sharding_and_ids_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"ps\.sharding must be one of mod, range"):
        RowSharding(10, 2, "hash")
    with pytest.raises(ConfigError, match="3 servers for a table of 2 rows"):
        RowSharding(2, 3)
    with pytest.raises(ConfigError, match="id 10 is outside the table's 10 rows"):
        RowSharding(10, 2).split(torch.tensor([1, 10]))


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
@pytest.mark.parametrize("scheme", ["mod", "range"])
def test_a_sparse_update_on_two_servers_equals_the_dense_table(optimizer: str, scheme: str) -> None:
    rows, dim = 5000, 4  # two init blocks
    dense = ShardTable(torch.arange(rows), dim, optimizer=optimizer, lr=0.1, seed=3)
    sh = RowSharding(rows, 2, scheme)
    shards = [ShardTable(sh.global_ids(s), dim, optimizer=optimizer, lr=0.1, seed=3) for s in range(2)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        ids = torch.randint(0, rows, (64,), generator=gen)
        ids[:8] = ids[0]  # duplicates: summed before the update
        grads = torch.randn(64, dim, generator=gen)
        pulled = torch.empty(64, dim)
        for s, (pos, local) in enumerate(sh.split(ids)):
            pulled[pos] = shards[s].pull(local)
            shards[s].push(local, grads[pos])
        assert torch.equal(pulled, dense.pull(ids))
        dense.push(ids, grads)
    whole = torch.empty(rows, dim)
    for s in range(2):
        whole[sh.global_ids(s)] = shards[s].weight
    assert torch.equal(whole, dense.weight)
    assert not torch.equal(dense.weight, ShardTable(torch.arange(rows), dim, seed=3).weight)  # it did move


def test_criteo_lines_parse_and_a_malformed_one_names_its_line(tmp_path: Path) -> None:
    log = ClickLog([100] * 26, n_dense=13, seed=1)
    path = tmp_path / "day_0.tsv"
    write_criteo(path, log, 50)
    batches = list(read_criteo(path, [100], batch_size=16))
    assert [len(b.label) for b in batches] == [16, 16, 16, 2]
    assert batches[0].ids.shape == (16, 26) and batches[0].dense.shape == (16, 13)
    assert int(batches[0].ids.max()) < 100 and set(batches[0].label.tolist()) <= {0.0, 1.0}
    label, dense, ids = parse_criteo_line("1\t\t5" + "\t" * 11 + "\tff" + "\t" * 25, [10], "x:1")
    assert label == 1.0 and dense[0] == 0.0 and dense[1] == pytest.approx(1.791759, rel=1e-5) and ids[0] == 255 % 10
    lines = path.read_text().splitlines()
    lines[6] = "\t".join(lines[6].split("\t")[:30])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"day_0.tsv:7: 30 tab-separated fields"):
        list(read_criteo(path, [100], batch_size=16))
    lines[6] = "x" + lines[5][1:]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"day_0.tsv:7: not a Criteo line"):
        list(read_criteo(path, [100], batch_size=16))


def test_auc_and_the_generators_ceiling() -> None:
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auc(torch.tensor([0.1, 0.2, 0.3, 0.4]), labels) == 1.0
    assert auc(torch.tensor([0.4, 0.3, 0.2, 0.1]), labels) == 0.0
    assert auc(torch.zeros(4), labels) == 0.5  # ties count half
    log = ClickLog([1000, 500, 50], n_dense=4, seed=0)
    b = log.batch(20_000, torch.Generator().manual_seed(1))
    ceiling = auc(log.logits(b.dense, b.ids), b.label)
    assert 0.8 < ceiling < 0.95  # learnable, not trivial
    assert abs(auc(torch.rand(20_000), b.label) - 0.5) < 0.02
    counts = torch.bincount(b.ids[:, 0], minlength=1000).sort(descending=True).values
    assert counts[:10].sum() > 0.25 * len(b.label)  # Zipf-like: a few ids are hot


def test_the_plan_counts_every_row_once_with_its_optimizer_state() -> None:
    from disttrain.ps.config import PSConfig
    from disttrain.ps.plan import render_plan, server_bytes

    cfg = PSConfig(servers=3, tables=(1000, 10), dim=8)
    shards = server_bytes(cfg)
    assert sum(r for r, _ in shards) == 1010 and sum(b for _, b in shards) == 1010 * 8 * 4 * 2  # rows + Adagrad
    assert sum(b for _, b in server_bytes(PSConfig(servers=3, tables=(1000, 10), dim=8, optimizer="sgd"))) == 1010 * 32
    assert "does NOT fit" in render_plan(cfg, host_bytes=1000) and "fits" in render_plan(cfg, host_bytes=10**9)


@pytest.mark.parametrize("resume_at", [1, 3, 7])  # 7: past the end of the first pass (3 batches of 16 per pass)
def test_a_resumed_criteo_stream_goes_on_where_an_uninterrupted_one_would(tmp_path: Path, resume_at: int) -> None:
    path = tmp_path / "day_0.tsv"
    write_criteo(path, ClickLog([100] * 26, n_dense=13, seed=1), 60)  # 10 held out, 50 to train: 3 full batches
    gen = torch.Generator()
    straight = CriteoFile(path, [100], held_out=10)
    expected = [straight.batch(16, gen) for _ in range(resume_at + 2)][resume_at:]
    resumed = CriteoFile(path, [100], held_out=10)
    resumed.seek(resume_at, 16)
    for want in expected:
        got = resumed.batch(16, gen)
        assert torch.equal(got.ids, want.ids) and torch.equal(got.label, want.label)
    fresh = CriteoFile(path, [100], held_out=10).batch(16, gen)
    assert torch.equal(fresh.ids, expected[0].ids) == (resume_at % 3 == 0)  # a whole pass later: the start again


def test_every_disttrain_ps_command_in_its_guide_parses() -> None:
    from disttrain.cli.ps import FLAGS
    from disttrain.config import parse_command
    from disttrain.ps.config import PSJobConfig

    guide = (Path(__file__).resolve().parents[2] / "docs" / "parameter-server.md").read_text()
    bash = "\n".join(re.findall(r"```bash\n(.*?)```", guide, flags=re.S))
    commands = [line.split("#")[0].split()[2:] for line in bash.splitlines() if line.startswith("disttrain ps ")]
    assert len(commands) >= 5
    for argv in commands:
        line = parse_command(PSJobConfig, argv, "disttrain ps", "", FLAGS)
        assert line is not None and line.cfg.ps.servers >= 1, argv


def test_a_ps_job_round_trips_through_its_config_toml(tmp_path: Path) -> None:
    """What the parent writes to the run folder is what the workers read back, every section."""
    from disttrain.config import load_toml, parse_command, to_toml
    from disttrain.ps.config import PSJobConfig

    argv = ["--ps.tables", "100", "50", "--ps.mode", "ssp", "--train.steps", "7", "--health.heartbeat-s", "0.5"]
    line = parse_command(PSJobConfig, [*argv, "--run.name", "x", "--launch.max-restarts", "2"], "disttrain ps", "")
    assert line is not None
    (tmp_path / "config.toml").write_text(to_toml(line.cfg))
    back = load_toml(tmp_path / "config.toml", job=PSJobConfig)
    assert back == line.cfg and back.ps.tables == (100, 50) and back.train.steps == 7
    assert back.launch.max_restarts == 2 and back.health.heartbeat_s == 0.5 and back.run.name == "x"


def _costs(rows: float, trainers: int = 2, servers: int = 2) -> StepCosts:
    return StepCosts(2e-3, 3e-4, tuple((rows,) * servers for _ in range(trainers)), dense_params=4000, dim=16)


def test_the_speed_plan_is_the_busiest_link_directions_bytes_on_a_slow_link_and_compute_on_a_fast_one() -> None:
    cfg = PSJobConfig()  # 2 trainers x 2 servers, colocated, overlapped steps of 2 x 256
    slow = {"rpc": (5e-4, 1e9), "rpc_inter": (1e-3, 2e6)}
    p = predict(cfg, _costs(400), slow, nnodes=2, cores=2)
    # each process sends one message across and answers one: no message to its own server
    sent, answered = message_bytes(400, 16, 16_000)
    assert sent == 400 * (8 + 64 + 8) + MESSAGE_BYTES + 16_000 and answered == 400 * 64 + MESSAGE_BYTES + 16_000
    bare_sent, bare_answer = message_bytes(400, 16, 0)  # trainer 0 -> server 1 carries no dense gradient
    assert p.bytes_per_step == int(sent + answered + bare_sent + bare_answer) == p.cross_bytes
    # overlapped: each direction carries one trainer's send and the other node's server's answer at once; one
    # of the two carries the dense gradient
    assert p.messages_s == pytest.approx(1e-3 + (sent + bare_answer) / 2e6)
    assert p.messages_s == pytest.approx(1e-3 + (bare_sent + answered) / 2e6)
    # overlapped: the step is a message's round trip (its CPU at the trainer, travel, the update and its end there)
    assert p.bound == "messages" and p.step_s == pytest.approx(2.5e-4 + p.messages_s + 3e-4 + 2.5e-4)
    assert p.samples_per_s == pytest.approx(512 / p.step_s)
    plain = predict(PSJobConfig(ps=PSConfig(overlap="off")), _costs(400), slow, nnodes=2, cores=2)
    # plain: the sends cross at once (the one carrying the dense gradient is the longest), then the answers;
    # compute, then the message
    assert plain.messages_s == pytest.approx(1e-3 + sent / 2e6 + answered / 2e6) and plain.step_s > p.step_s
    fast = predict(cfg, _costs(400), {"rpc": (5e-4, 1e9)}, nnodes=1, cores=2)
    assert fast.bound == "compute" and fast.cpu_s == pytest.approx(2e-3 + 3e-4 + 2 * 2.5e-4)
    crowded = predict(cfg, _costs(400), {"rpc": (5e-4, 1e9)}, nnodes=1, cores=1)  # 2 processes share a core
    assert crowded.cpu_s == pytest.approx(2 * fast.cpu_s)
    apart = predict(PSJobConfig(ps=PSConfig(colocate="off")), _costs(400), slow, nnodes=2, cores=2)
    # ranks in order (trainers, then servers): node 0 holds both trainers, node 1 both servers: all of it crosses
    assert apart.cross_bytes == apart.bytes_per_step > p.bytes_per_step


def test_the_rpc_link_is_the_slowest_payload_rate_beyond_the_round_trip() -> None:
    fit = fit_rpc_link({"ping_s": 1e-3, "points": [(65536, 1e-3 + 65536 / 4e6), (2**20, 1e-3 + 2**20 / 2e6)]})
    assert fit.latency_s == 1e-3 and fit.bandwidth_Bps == pytest.approx(2e6)  # the burst of a small payload
    with pytest.raises(ValueError, match="round trip"):
        fit_rpc_link({"ping_s": 1.0, "points": [(65536, 0.5)]})


def test_a_round_trip_slowed_by_a_busy_machine_is_bounded_by_the_fastest_call() -> None:
    # figures doctor read under the load harness: the empty call was slower than every payload call
    pts = [(65536, 0.002480901001035818), (262144, 0.003583379000701825), (1048576, 0.005358317999707651)]
    fit = fit_rpc_link({"ping_s": 0.008854403499753971, "points": pts})
    assert fit.latency_s == pts[0][1]
    assert fit.bandwidth_Bps == pytest.approx(262144 / (pts[1][1] - pts[0][1]))
