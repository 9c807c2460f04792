"""This machine's figures for the step-time plan, measured by ``disttrain doctor`` and cached per host: the
latency and bandwidth of its links (a fit of all-gather times over sizes, and of reduce-scatter and all-reduce
times on their own: gloo's reduce-scatter runs at half its all-gather's rate, its all-reduce at twice what a
ring of all-gathers would), its matmul peak and element-wise rate per dtype, and the compute efficiency
measured steps reached (``disttrain estimate --measure``); on a CPU, the framework time per operator and FSDP2's
fixed cost per unit pass.

The cache is one JSON file, ``$DISTTRAIN_CACHE_DIR/machine.json`` (else ``$XDG_CACHE_HOME/disttrain`` or
``~/.cache/disttrain``), one entry per host name (a home folder shared by the nodes of a cluster keeps each
node's own figures). A file that cannot be read is ignored with one line on stderr, never a traceback.
May import: ``disttrain.errors``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disttrain.errors import ConfigError

VERSION = 1


@dataclass(frozen=True)
class LinkFit:
    """A link as the alpha-beta model sees it: ``latency_s`` per ring step, ``bandwidth_Bps`` of one rank."""

    latency_s: float
    bandwidth_Bps: float
    nranks: int
    points: tuple[tuple[int, float], ...] = ()
    """(total all-gathered bytes, seconds) as measured."""
    source: str = "measured"
    by_kind: dict[str, tuple[float, float]] = field(default_factory=dict)
    """``reduce_scatter`` / ``all_reduce`` -> (latency_s, bandwidth_Bps) of the same ring model fitted to that
    collective's own times, where it was measured (a backend need not run them as rings of equal rate)."""

    def ring_time(self, nbytes: int, n: int, kind: str) -> float:
        """Seconds for a ring collective over ``n`` ranks of a buffer of ``nbytes`` (the full, unsharded size):
        all-gather / reduce-scatter ``(n-1) (latency + nbytes / n / bandwidth)``, all-reduce twice that; with the
        collective's own fit where it was measured, else the all-gather's."""
        if n <= 1:
            return 0.0
        latency, bandwidth = self.by_kind.get(kind, (self.latency_s, self.bandwidth_Bps))
        t = (n - 1) * (latency + nbytes / n / bandwidth)
        return 2 * t if kind == "all_reduce" else t

    def efficiency(self, nbytes: int, n: int) -> float:
        """Share of the bandwidth an all-gather of ``nbytes`` reaches (the rest is latency)."""
        if n <= 1:
            return 1.0
        pure, total = (n - 1) * nbytes / n / self.bandwidth_Bps, self.ring_time(nbytes, n, "all_gather")
        return pure / total if total > 0 else 1.0

    def size_for(self, share: float, n: int) -> int:
        """The all-gather size (bytes) that reaches ``share`` of the bandwidth."""
        return int(share / (1 - share) * self.latency_s * self.bandwidth_Bps * n) if share < 1 else 0


@dataclass(frozen=True)
class MachineProfile:
    host: str
    device: str
    device_name: str
    cores: int
    matmul_tflops: dict[str, float]
    """Per compute dtype: one thread's (CPU) or the device's (GPU) square-matmul peak."""
    links: dict[str, LinkFit]
    """``intra`` (within a node), ``inter`` (across nodes, when measured); ``rpc`` / ``rpc_inter``: the RPC link
    within a node / across nodes (:func:`fit_rpc_link`)."""
    measured_at: str = ""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Per compute dtype: the share of the matmul peak measured training steps reached."""
    efficiency_runs: dict[str, list[float]] = field(default_factory=dict)
    """Per compute dtype: the efficiencies the last few ``estimate --measure`` runs learned (``efficiency`` is
    their median: one run's three steps on a busy machine can be 10% off)."""
    elementwise_rate: dict[str, float] = field(default_factory=dict)
    """Per compute dtype: elements per second one thread (CPU) or the device writes in a block's element-wise
    work (norms, activations, softmax, casts)."""
    op_overhead_s: float = 0.0
    """Framework time per forward operator (0: not measured)."""
    unit_overhead_s: float = 0.0
    """FSDP2's fixed cost per unit pass, as on a core of its own (0: not measured)."""
    nodes_sharing_cores: int = 1
    """How many nodes of the last doctor run across nodes ran on this one machine and shared its ``cores``
    (network namespaces or containers of one host: their boot ids matched); 1: each node its own machine."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def missing(self, dtype: str, nproc: int) -> list[str]:
        """The figures a plan of ``nproc`` local ranks in ``dtype`` needs that this profile lacks (a cache from an
        older version, or a doctor run with one process)."""
        cpu = self.device == "cpu"
        wanted = {
            "matmul peak": not cpu or dtype in self.matmul_tflops,
            "element-wise rate": not cpu or dtype in self.elementwise_rate,
            "link": nproc <= 1 or "intra" in self.links,
            "framework time per operator": not cpu or self.op_overhead_s > 0,
            "FSDP cost per unit": not cpu or nproc <= 1 or self.unit_overhead_s > 0,
        }
        return [name for name, ok in wanted.items() if not ok]

    @staticmethod
    def from_json(d: dict[str, Any]) -> MachineProfile:
        links = {
            k: LinkFit(
                float(v["latency_s"]),
                float(v["bandwidth_Bps"]),
                int(v["nranks"]),
                tuple((int(b), float(s)) for b, s in v.get("points", ())),
                str(v.get("source", "measured")),
                {kind: (float(lat), float(bw)) for kind, (lat, bw) in v.get("by_kind", {}).items()},
            )
            for k, v in d.get("links", {}).items()
        }
        return MachineProfile(
            str(d["host"]),
            str(d["device"]),
            str(d.get("device_name", "")),
            int(d.get("cores", os.cpu_count() or 1)),
            {k: float(v) for k, v in d.get("matmul_tflops", {}).items()},
            links,
            str(d.get("measured_at", "")),
            {k: float(v) for k, v in d.get("efficiency", {}).items()},
            {k: [float(x) for x in v] for k, v in d.get("efficiency_runs", {}).items()},
            {k: float(v) for k, v in d.get("elementwise_rate", {}).items()},
            float(d.get("op_overhead_s", 0.0)),
            float(d.get("unit_overhead_s", 0.0)),
            int(d.get("nodes_sharing_cores", 1)),
        )


def cache_path() -> Path:
    """Where the machine cache lives (see the module docstring)."""
    if os.environ.get("DISTTRAIN_CACHE_DIR"):
        return Path(os.environ["DISTTRAIN_CACHE_DIR"]) / "machine.json"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "disttrain" / "machine.json"


def _read() -> dict[str, Any]:
    path = cache_path()
    if not path.exists():
        return {"version": VERSION, "machines": {}}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("machines"), dict):
            raise ValueError("no 'machines' table")
        return data
    except (OSError, ValueError) as e:
        print(
            f"disttrain: warning: ignoring the machine cache {path} ({e}); `disttrain doctor` rewrites it",
            file=sys.stderr,
        )
        return {"version": VERSION, "machines": {}}


def load_machine(host: str | None = None) -> MachineProfile | None:
    """This host's cached figures, or None."""
    entry = _read()["machines"].get(host or socket.gethostname())
    if entry is None:
        return None
    try:
        return MachineProfile.from_json(entry)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        print(
            f"disttrain: warning: ignoring a broken entry in {cache_path()} ({type(e).__name__}: {e})", file=sys.stderr
        )
        return None


def cached_peak_tflops(device: str, dtype: str) -> float | None:
    """One thread's (CPU) or the device's matmul peak in ``dtype`` that ``disttrain doctor`` cached for this
    host, or None: the one figure the plan and the run's MFU both use (re-measuring it at every start read
    0.17 to 0.52 TFLOP/s within one hour on a busy machine)."""
    prof = load_machine()
    return prof.matmul_tflops.get(dtype) if prof is not None and prof.device == device else None


def save_machine(profile: MachineProfile) -> Path:
    """Merge ``profile`` into the cache under its host (atomic: a temporary file, then a rename)."""
    data = _read()
    stamped = (
        profile
        if profile.measured_at
        else dataclasses.replace(profile, measured_at=datetime.datetime.now().isoformat(timespec="seconds"))
    )
    data["machines"][profile.host] = stamped.to_json()
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def fit_links(curve: dict[str, Any]) -> LinkFit:
    """A link from what ``disttrain doctor`` measured over it: ``{"nranks": N, "points": [all-gather (bytes,
    seconds)], "kinds": {"reduce_scatter": [...], "all_reduce": [...]}}`` (``kinds`` where measured). An
    all-reduce is fitted as two rings (its times halved), so its (latency, bandwidth) read like the others'."""
    n = int(curve["nranks"])
    link = fit_link([(int(b), float(t)) for b, t in curve["points"]], n)
    by_kind = {}
    for kind, pts in curve.get("kinds", {}).items():
        half = 2.0 if kind == "all_reduce" else 1.0
        f = fit_link([(int(b), float(t) / half) for b, t in pts], n)
        by_kind[kind] = (f.latency_s, f.bandwidth_Bps)
    return dataclasses.replace(link, by_kind=by_kind)


def fit_link(points: list[tuple[int, float]], nranks: int) -> LinkFit:
    """Least squares of ``t = (n-1) latency + (n-1)/n bytes / bandwidth`` over measured (bytes, seconds), in
    relative error (each point weighs 1/t^2: a 4 KiB point's 0.1 ms counts as much as a 16 MiB point's 80 ms),
    with latency >= 0 and bandwidth > 0. With 4 points or more, one point off the line by more than half its
    time (a busy machine's hiccup) is left out of the fit; ``points`` keeps every measurement."""
    pts = [(int(b), float(t)) for b, t in points if t > 0 and b > 0]
    if not pts:
        raise ValueError(f"fit_link: no measured (bytes, seconds) points with both > 0 in {points!r}")
    n = max(nranks, 2)
    xs, ys = [(n - 1) / n * b for b, _ in pts], [t for _, t in pts]
    intercept, slope = _weighted_line(xs, ys)
    if len(pts) >= 4:
        errs = [abs(intercept + slope * x - y) / y for x, y in zip(xs, ys, strict=True)]
        worst = max(range(len(pts)), key=errs.__getitem__)
        if errs[worst] > 0.5:
            intercept, slope = _weighted_line(xs[:worst] + xs[worst + 1 :], ys[:worst] + ys[worst + 1 :])
    return LinkFit(intercept / (n - 1), 1.0 / slope, nranks, tuple(pts))


def fit_rpc_link(figures: dict[str, Any]) -> LinkFit:
    """The RPC link doctor measured (``{"ping_s": s, "points": [(bytes, seconds)]}``: calls carrying a tensor one
    way): ``latency_s`` is a small call's round trip, ``bandwidth_Bps`` the one-way rate of the payload beyond
    it (``t = ping + bytes / bandwidth``, each point's own rate, the slowest taken: a rate-limited link's
    first bytes pass in a burst). Kept under ``rpc`` (within a node) or ``rpc_inter`` (across nodes)."""
    pts = [(int(b), float(t)) for b, t in figures["points"]]
    # a round trip slower than a call that carried a payload was a busy machine's hiccup: the fastest call bounds it
    ping = min([float(figures["ping_s"])] + [t for _, t in pts])
    rates = [b / (t - ping) for b, t in pts if t > ping]
    if not rates:
        raise ValueError(f"fit_rpc_link: no payload took longer than the round trip ({ping} s) in {pts!r}")
    return LinkFit(ping, min(rates), 2, tuple(pts), source="measured")


def _weighted_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept >= 0, slope > 0) of ``y = intercept + slope x`` by least squares weighted 1/y^2."""
    ws = [1 / y**2 for y in ys]
    sw = sum(ws)
    sx, sy = sum(w * x for w, x in zip(ws, xs, strict=True)), sum(w * y for w, y in zip(ws, ys, strict=True))
    sxx = sum(w * x * x for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True))
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det if det > 1e-12 * sw * sxx else 0.0
    intercept = (sy - slope * sx) / sw
    if intercept < 0:  # latency cannot be negative: the best line through the origin
        slope, intercept = sxy / sxx, 0.0
    if slope <= 0:  # no size took longer than a smaller one: take the largest transfer's rate, no latency
        slope, intercept = max(ys) / max(xs), 0.0
    return intercept, slope


_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_BANDWIDTH = re.compile(
    r"\s*(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
    r"(?:(?P<prefix>[kKmMgGtT]i?)?(?P<unit>B|bits?|b)(?:/s|ps)?)\s*"
)


def parse_bandwidth(text: str, what: str) -> float:
    """'25GB/s', '25GiB/s', '100Gbit/s' (or '100Gb/s', '100Gbps'), '800Mbit/s', '1.5e9B/s' -> bytes per second.
    ``B`` is a byte, ``b`` and ``bit`` a bit, as network links are rated. A number without a unit is an error
    ('25' was once read as 25 bytes/s and planned a step of 15 days)."""
    m = _BANDWIDTH.fullmatch(text)
    value = float(m.group("num")) if m else 0.0
    if m is None or not 0 < value < float("inf"):
        raise ConfigError(
            f"{what}: cannot read {text!r} as a bandwidth; write a number and a unit, e.g. 25GB/s or 12.5GiB/s "
            "(bytes per second) or 100Gbit/s (bits per second)"
        )
    scale = _PREFIX[(m.group("prefix") or "").lower()]
    return value * scale / (8 if m.group("unit") in ("b", "bit", "bits") else 1)


def boot_id() -> str:
    """This machine's boot id: the same in every network namespace, PID namespace or container of one kernel,
    so two "nodes" reporting one id share its cores ("" where Linux does not say)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
