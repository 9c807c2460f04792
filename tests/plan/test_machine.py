"""The machine profile `disttrain doctor` caches for the step-time plan (disttrain.plan.machine): the alpha-beta
fit of all-gather times, ring-collective arithmetic, bandwidth parsing, and the per-host cache file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from disttrain.errors import ConfigError
from disttrain.plan.machine import (
    LinkFit,
    MachineProfile,
    cache_path,
    fit_link,
    fit_links,
    load_machine,
    parse_bandwidth,
    save_machine,
)

pytestmark = pytest.mark.timeout(30)

SIZES = (4 * 2**10, 64 * 2**10, 2**20, 4 * 2**20, 16 * 2**20)


def curve(alpha: float, beta: float, n: int, noise: tuple[float, ...] = (1, 1, 1, 1, 1)) -> list[tuple[int, float]]:
    return [(b, ((n - 1) * alpha + (n - 1) / n * b / beta) * e) for b, e in zip(SIZES, noise, strict=True)]


@pytest.mark.parametrize(("alpha", "beta", "n"), [(85e-6, 0.9e9, 2), (5e-6, 150e9, 8), (2e-3, 1e8, 4)])
def test_fit_link_recovers_latency_and_bandwidth(alpha: float, beta: float, n: int) -> None:
    fit = fit_link(curve(alpha, beta, n), n)
    assert fit.latency_s == pytest.approx(alpha, rel=0.01) and fit.bandwidth_Bps == pytest.approx(beta, rel=0.01)
    assert fit.nranks == n and len(fit.points) == 5 and fit.source == "measured"
    # a few percent of noise on every point still gives both within a few percent (relative-error fit)
    noisy = fit_link(curve(alpha, beta, n, (1.03, 0.98, 1.02, 0.97, 1.01)), n)
    assert noisy.latency_s == pytest.approx(alpha, rel=0.1) and noisy.bandwidth_Bps == pytest.approx(beta, rel=0.05)
    # one point a busy machine made 4x slower is left out of the fit (and kept in the points)
    hiccup = fit_link(curve(alpha, beta, n, (1, 4, 1, 1, 1)), n)
    assert hiccup.latency_s == pytest.approx(alpha, rel=0.01) and hiccup.bandwidth_Bps == pytest.approx(beta, rel=0.01)
    assert hiccup.points == tuple(curve(alpha, beta, n, (1, 4, 1, 1, 1)))


def test_fit_link_keeps_latency_non_negative_and_bandwidth_positive() -> None:
    # times that fall below the line through the origin at small sizes would give a negative intercept
    pts = [(b, b / 1e9 * (0.5 if b < 2**20 else 1.0)) for b in SIZES]
    fit = fit_link(pts, 2)
    assert fit.latency_s == 0.0 and fit.bandwidth_Bps > 0
    flat = fit_link([(b, 1e-3) for b in SIZES], 2)  # no size took longer: all latency, never a negative slope
    assert flat.latency_s >= 0 and flat.bandwidth_Bps > 0
    with pytest.raises(ValueError, match="no measured"):
        fit_link([], 2)


def test_ring_time_and_efficiency_arithmetic() -> None:
    link = LinkFit(latency_s=1e-4, bandwidth_Bps=1e9, nranks=4)
    # all-gather of 8 MB over 4 ranks: 3 steps of (100 us + 2 MB / 1 GB/s)
    assert link.ring_time(8_000_000, 4, "all_gather") == pytest.approx(3 * (1e-4 + 2e-3))
    assert link.ring_time(8_000_000, 4, "reduce_scatter") == link.ring_time(8_000_000, 4, "all_gather")
    assert link.ring_time(8_000_000, 4, "all_reduce") == pytest.approx(2 * 3 * (1e-4 + 2e-3))
    assert link.ring_time(8_000_000, 1, "all_reduce") == 0.0
    assert link.efficiency(8_000_000, 4) == pytest.approx(2e-3 / 2.1e-3)
    assert link.efficiency(1, 1) == 1.0
    assert link.efficiency(link.size_for(0.8, 4), 4) == pytest.approx(0.8, rel=1e-3)


def test_each_collective_measured_on_its_own_is_timed_by_its_own_fit() -> None:
    # as gloo on 2 ranks here: reduce-scatter at half the all-gather's rate, all-reduce at twice a ring's
    ag, rs, ar = (85e-6, 0.9e9), (100e-6, 0.45e9), (60e-6, 1.8e9)
    half_ar = curve(*ar, 2)
    link = fit_links(
        {
            "nranks": 2,
            "points": curve(*ag, 2),
            "kinds": {"reduce_scatter": curve(*rs, 2), "all_reduce": [(b, 2 * t) for b, t in half_ar]},
        }
    )
    assert (link.latency_s, link.bandwidth_Bps) == pytest.approx(ag, rel=0.01)
    assert link.by_kind["reduce_scatter"] == pytest.approx(rs, rel=0.01)
    assert link.by_kind["all_reduce"] == pytest.approx(ar, rel=0.01)
    size = 43 * 2**20
    assert link.ring_time(size, 2, "reduce_scatter") == pytest.approx(rs[0] + size / 2 / rs[1])
    assert link.ring_time(size, 2, "all_reduce") == pytest.approx(2 * (ar[0] + size / 2 / ar[1]))
    assert link.ring_time(size, 2, "all_gather") == pytest.approx(ag[0] + size / 2 / ag[1])
    # an all-gather curve alone (an older cache, a --bandwidth override): every kind as rings of all-gathers
    plain = fit_links({"nranks": 2, "points": curve(*ag, 2)})
    assert plain.by_kind == {} and plain.ring_time(size, 2, "reduce_scatter") == plain.ring_time(size, 2, "all_gather")
    # the per-kind fits survive the cache; an entry written before them still loads
    prof = MachineProfile("h", "cpu", "x", 2, {}, {"intra": link})
    assert MachineProfile.from_json(json.loads(json.dumps(prof.to_json()))) == prof
    old = prof.to_json()
    del old["links"]["intra"]["by_kind"]
    assert MachineProfile.from_json(old).links["intra"].by_kind == {}


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("25GB/s", 25e9),
        ("25GiB/s", 25 * 2**30),
        ("100Gbit/s", 12.5e9),
        ("100Gb/s", 12.5e9),
        ("100Gbps", 12.5e9),
        ("800Mbit/s", 1e8),
        ("1.5e9B/s", 1.5e9),
        (" 2 GB/s ", 2e9),
        ("512MiB/s", 512 * 2**20),
    ],
)
def test_parse_bandwidth_units(text: str, bps: float) -> None:
    assert parse_bandwidth(text, "--bandwidth") == pytest.approx(bps)


@pytest.mark.parametrize("bad", ["fast", "1..5", "0", "GB/s", "-1GB/s", "25XB/s", "inf", "25", "1.5e9"])
def test_parse_bandwidth_says_what_value_and_an_example(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_bandwidth(bad, "--inter-node-bandwidth")
    msg = str(err.value)
    assert msg.startswith("--inter-node-bandwidth: ") and repr(bad) in msg and "e.g. 25GB/s" in msg


def profile(host: str = "node0", **kw: object) -> MachineProfile:
    link = fit_link(curve(85e-6, 0.9e9, 2), 2)
    return MachineProfile(host, "cpu", "AMD EPYC", 2, {"fp32": 0.17}, {"intra": link}, **kw)  # type: ignore[arg-type]


def test_save_and_load_round_trip_per_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_path() == tmp_path / "cache" / "machine.json" and load_machine("node0") is None
    a, b = profile("node0", efficiency={"fp32": 0.5}), profile("node1", measured_at="2026-01-01T00:00:00")
    assert save_machine(a) == cache_path() and save_machine(b) == cache_path()
    data = json.loads(cache_path().read_text())
    assert data["version"] == 1 and set(data["machines"]) == {"node0", "node1"}
    got = load_machine("node0")
    assert got is not None and got.measured_at  # stamped when saved
    assert got == dataclasses.replace(a, measured_at=got.measured_at)
    assert load_machine("node1") == b and load_machine("elsewhere") is None
    assert [p.name for p in cache_path().parent.iterdir()] == ["machine.json"]  # no temporary file left


def test_cache_path_falls_back_to_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "disttrain" / "machine.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_path() == tmp_path / "home" / ".cache" / "disttrain" / "machine.json"


@pytest.mark.parametrize("text", ["{not json", '{"version": 1}', '{"version": 1, "machines": {"node0": [1, 2]}}'])
def test_a_broken_cache_is_ignored_with_one_warning(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISTTRAIN_CACHE_DIR", str(tmp_path))
    (tmp_path / "machine.json").write_text(text)
    assert load_machine("node0") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: ignoring" in err and "machine.json" in err and "Traceback" not in err
    save_machine(profile())  # doctor rewrites it
    assert load_machine("node0") is not None


@pytest.mark.timing
def test_a_slow_dtype_is_measured_quickly_and_the_best_peak_is_kept() -> None:
    import time

    import torch

    from disttrain.jobs.doctor import _best_peaks
    from disttrain.utils.peak import measure_matmul_tflops

    torch.set_num_threads(1)
    c0 = time.process_time()
    bf16 = measure_matmul_tflops(torch.device("cpu"), torch.bfloat16, seconds=0.2)
    fp32 = measure_matmul_tflops(torch.device("cpu"), torch.float32, seconds=0.2)
    # emulated bf16 (no AMX / AVX512-BF16) runs ~1 GFLOP/s: a 1024 x 1024 matmul alone would take ~2 s of CPU
    assert bf16 > 0 and fp32 > 0 and time.process_time() - c0 < 3.0
    assert _best_peaks({"fp32": 0.07, "bf16": 0.5}, {"fp32": 0.05}) == {"fp32": 0.07}
    assert _best_peaks({"fp32": 0.07}, {"fp32": 0.08, "bf16": 0.4}) == {"fp32": 0.08, "bf16": 0.4}


@pytest.mark.timing
def test_the_matmul_peak_is_the_cores_not_the_share_a_busy_machine_leaves() -> None:
    """Under the load harness the wall-clock peak read 0.0004 TFLOP/s (1000x slow) and every plan tied; the CPU
    peak is timed on the process's CPU clock, so busy processes beside it leave it where it was."""
    import os
    import subprocess
    import sys

    import torch

    from disttrain.utils.peak import measure_matmul_tflops

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    quiet = max(measure_matmul_tflops(cpu, torch.float32, seconds=0.2) for _ in range(2))
    burn = "import time\nt = time.time() + 30\nwhile time.time() < t: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(3 * (os.cpu_count() or 1))]
    try:
        busy = max(measure_matmul_tflops(cpu, torch.float32, seconds=0.2) for _ in range(2))
    finally:
        for b in burners:
            b.kill()
            b.wait()
    # the wall clock would read it at ~1/4 of the quiet figure with three busy processes per core
    assert busy > 0.6 * quiet, (busy, quiet)
