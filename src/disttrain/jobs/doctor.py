"""``disttrain doctor``: is this machine (or cluster) ready to train, and if not, what to do about it.

Each check prints one line, OK / WARN / FAIL, and a fix for anything not OK: Python, torch, CUDA and
NCCL versions, devices and their memory, gloo/NCCL availability, the rendezvous port free (or the
rendezvous endpoint reachable), then a short all-reduce / all-gather bandwidth test and an RPC ping across
the local ranks (across nodes with ``--nnodes N --rdzv-endpoint HOST:PORT``, one ``doctor`` per node),
started through torchrun like a real job. The same test measures the all-gather latency/bandwidth curve and
one thread's matmul peak, which this module fits and caches per host for ``disttrain estimate``
(:mod:`disttrain.plan.machine`). Exit code 1 if anything FAILs; ``--json`` for machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from disttrain.config import LaunchConfig
from disttrain.launch.k8s.env import Cluster, detect, in_cluster
from disttrain.launch.network import is_local
from disttrain.plan.machine import LinkFit, MachineProfile, fit_links, fit_rpc_link, load_machine, save_machine
from disttrain.utils.fmt import fmt_rate
from disttrain.utils.host import cpu_name

Status = Literal["OK", "WARN", "FAIL"]
MIN_TORCH = (2, 6)
# Below these an all-reduce is suspiciously slow for the backend (GB/s of payload per rank).
SLOW_GBPS = {"gloo": 0.05, "nccl": 5.0}


@dataclasses.dataclass
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Figures behind the line, for ``--json`` (the link check: the cached machine profile)."""


# -- checks of this machine -------------------------------------------------------------------------------
def check_python() -> Check:
    v = sys.version_info
    ok = (v.major, v.minor) >= (3, 11)
    return Check("python", "OK" if ok else "FAIL", sys.version.split()[0], "" if ok else "use Python 3.11 or newer")


def check_torch() -> Check:
    ver = torch.__version__
    major_minor = tuple(int(x) for x in ver.split("+")[0].split(".")[:2])
    ok = major_minor >= MIN_TORCH
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    fix = "" if ok else "install torch >= 2.6 (FSDP2 fully_shard): pip install -U torch"
    return Check("torch", "OK" if ok else "FAIL", f"{ver} ({build})", fix)


def check_cuda() -> list[Check]:
    if not torch.cuda.is_available():
        gpus_here = Path("/dev/nvidia0").exists()
        if gpus_here and not torch.version.cuda:
            return [
                Check(
                    "cuda",
                    "WARN",
                    "this machine has NVIDIA GPUs but torch is a CPU build",
                    "install a CUDA build of torch first (see the README: Torch, CPU machines and GPU machines)",
                )
            ]
        if gpus_here:
            return [
                Check(
                    "cuda",
                    "FAIL",
                    f"torch {torch.version.cuda} cannot use the GPUs",
                    "check the driver (nvidia-smi) and that it supports this CUDA version",
                )
            ]
        return [Check("cuda", "OK", "no CUDA device: training runs on CPU processes with gloo")]
    out = [Check("cuda", "OK", f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)")]
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        status: Status = "OK" if free > 0.5 * total else "WARN"
        fix = "" if status == "OK" else "another process holds this GPU's memory (nvidia-smi shows which)"
        name = torch.cuda.get_device_name(i)
        out.append(Check(f"gpu{i}", status, f"{name}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free", fix))
    return out


def check_host() -> Check:
    import psutil

    mem = psutil.virtual_memory()
    cores = os.cpu_count() or 1
    status: Status = "OK" if mem.available > 2 * 2**30 else "WARN"
    fix = "" if status == "OK" else "less than 2 GiB of RAM free: close other programs or use smaller models"
    return Check(
        "host", status, f"{cores} CPU core(s), {mem.available / 2**30:.1f} of {mem.total / 2**30:.1f} GiB RAM free", fix
    )


def check_backends() -> list[Check]:
    out = []
    gloo = dist.is_available() and dist.is_gloo_available()
    out.append(
        Check(
            "gloo",
            "OK" if gloo else "FAIL",
            "available" if gloo else "not built into this torch",
            "" if gloo else "install an official torch build (gloo is needed for CPU tensors)",
        )
    )
    if torch.cuda.is_available():
        nccl = dist.is_nccl_available()
        ver = ".".join(map(str, torch.cuda.nccl.version())) if nccl else "missing"
        out.append(
            Check(
                "nccl",
                "OK" if nccl else "FAIL",
                f"NCCL {ver}",
                "" if nccl else "install a CUDA torch build with NCCL (Linux wheels have it)",
            )
        )
    return out


def _port_owner(port: int) -> str:
    try:
        import psutil

        for c in psutil.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f" by pid {c.pid} ({psutil.Process(c.pid).name()})"
    except Exception:  # no permission to look: say nothing
        pass
    return ""


def port_is_free(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_port(port: int, what: str, severity: Status = "FAIL") -> Check:
    if port_is_free(port):
        return Check("port", "OK", f"{port} is free ({what})")
    return Check(
        "port",
        severity,
        f"{port} is already in use{_port_owner(port)} ({what})",
        f"stop what holds it, or use another port: --rdzv-endpoint HOST:{port + 1} "
        f"(disttrain run: --launch.rdzv-endpoint; scripts: MASTER_PORT={port + 1})",
    )


def check_rendezvous(endpoint: str | None, node_rank: int, timeout_s: float = 3.0, wait_s: float = 30.0) -> list[Check]:
    """No endpoint: one node, torchrun picks a free port. Node 0 on its own address: the port must be free
    (it will host the store); any other node: the endpoint must answer within ``wait_s``."""
    if not endpoint:
        return [Check("rendezvous", "OK", "single node (standalone): torchrun picks a free port")]
    host, _, port_s = endpoint.rpartition(":")
    if not host or not port_s.isdigit():
        return [
            Check(
                "rendezvous",
                "FAIL",
                f"{endpoint!r} is not HOST:PORT",
                "pass --rdzv-endpoint HOST:PORT, e.g. node0:29400",
            )
        ]
    port = int(port_s)
    try:
        socket.getaddrinfo(host, port)
    except OSError as e:
        return [
            Check(
                "rendezvous",
                "FAIL",
                f"cannot resolve {host!r} ({e.strerror or e})",
                "check the host name (or use its IP address), and that every node uses the same endpoint",
            )
        ]
    if node_rank == 0 and is_local(host):
        if port_is_free(port):
            return [Check("rendezvous", "OK", f"{endpoint}: this node (rank 0) will host it; the port is free")]
        return [check_port(port, f"node 0 hosts the rendezvous on {endpoint}")]
    deadline = time.monotonic() + wait_s  # node 0 may start a little later: its doctor opens the port
    while True:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return [Check("rendezvous", "OK", f"{endpoint} answers")]
        except OSError as e:
            if time.monotonic() >= deadline:
                return [
                    Check(
                        "rendezvous",
                        "FAIL",
                        f"cannot reach {endpoint} within {wait_s:.0f}s ({type(e).__name__}: {e})",
                        "start `disttrain doctor` on node 0 too (it hosts the rendezvous); check the address, the "
                        "port, and the firewall",
                    )
                ]
            time.sleep(0.5)


# -- the multi-process part: collectives and RPC, through torchrun (doctor_worker.py) ------------------
def _doctor_argv(nproc: int, nnodes: str, node_rank: int, endpoint: str | None, tmp: str) -> list[str]:
    from disttrain.config import LaunchConfig
    from disttrain.launch.torchrun import torchrun_argv

    launch = LaunchConfig(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=endpoint)
    argv = torchrun_argv(nproc, launch, Path(tmp) / "logs", quiet_ranks=True)
    return [*argv, "-m", "disttrain.jobs.doctor_worker", tmp]


def measure_machine(nproc: int = 2, rpc: bool = False) -> str:
    """The figures a plan needs of this machine (link curves, compute rates, framework costs: what ``disttrain
    doctor`` measures, without its other checks; ``rpc``: and the RPC link, for ``ps --plan``), over ``nproc``
    local ranks, cached for the next plans; the line that says what was measured, or why nothing was (the plan
    then keeps its defaults)."""
    from disttrain.launch.torchrun import run_torchrun

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"disttrain: measuring this machine for the plan ({nproc} processes, a few seconds, once: "
        "`disttrain doctor` measures it again)...",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="disttrain-machine-") as tmp:
        argv = [*_doctor_argv(nproc, "1", 0, None, tmp), "--machine-only", *(["--rpc"] if rpc else [])]
        with contextlib.redirect_stdout(sys.stderr):
            code = run_torchrun(argv, nproc, device)
        checks = check_link(Path(tmp, "machine.json")) if code == 0 else []
    if not checks or checks[0].status != "OK":
        why = checks[0].detail if checks else f"the {nproc}-process test failed (exit {code})"
        return f"could not measure this machine ({why}); the plan uses default figures (`disttrain doctor` says more)"
    return f"measured in {time.perf_counter() - t0:.1f} s: {checks[0].detail}"


def ensure_machine(device: str, dtype: str, nproc: int) -> None:
    """Before a plan for this machine (``device`` is the local one): measure the figures it needs when the cache
    has none for this host (:func:`measure_machine`, one line on stderr), so that no plan borrows another
    machine's defaults."""
    from disttrain.launch.torchrun import default_nproc

    have = load_machine()
    missing = have.missing(dtype, nproc) if have is not None and have.device == device else ["all"]
    if missing:
        line = measure_machine(min(default_nproc(device), 8) if device == "cuda" else 2)
        print(f"disttrain: {line}", file=sys.stderr, flush=True)


def check_multiprocess(nproc: int, nnodes: str, node_rank: int, endpoint: str | None) -> list[Check]:
    from disttrain.launch.torchrun import run_torchrun

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="disttrain-doctor-") as tmp:
        argv = _doctor_argv(nproc, nnodes, node_rank, endpoint, tmp)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            code = run_torchrun(argv, nproc, device)
        result = Path(tmp, "result.json")
        if code != 0 or (node_rank == 0 and not result.is_file()):
            return [
                Check(
                    "collectives",
                    "FAIL",
                    f"the {nproc}-process test failed (exit {code})",
                    "run `disttrain launch -n 2` on a small script to see the error; check ports and firewall",
                )
            ]
        link = check_link(Path(tmp, "machine.json"))
        measured = Path(tmp, "machine.json")
        rpc = json.loads(measured.read_text()).get("rpc", [None])[0] if measured.is_file() else None
        if not result.is_file():  # other nodes: rank 0's node has the figures
            return [Check("collectives", "OK", f"joined the test with {nproc} process(es)"), *link]
        res = json.loads(result.read_text())
    world, took = res["world"], time.perf_counter() - t0
    out = []
    for backend in ("gloo", "nccl"):
        if f"{backend}_all_reduce" not in res:
            continue
        ar, ag = res[f"{backend}_all_reduce"], res[f"{backend}_all_gather"]
        slow = ar < SLOW_GBPS[backend]
        out.append(
            Check(
                f"{backend} bandwidth",
                "WARN" if slow else "OK",
                f"all-reduce {ar:.2f} GB/s, all-gather {ag:.2f} GB/s per rank ({world} ranks)",
                "slow for this backend: check the network interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) "
                "and that nothing else saturates it"
                if slow
                else "",
            )
        )
    out += check_nodes(res)
    out += link
    if res.get("rpc_ms") is not None:
        rate = f"; {fmt_rate(fit_rpc_link(rpc).bandwidth_Bps)} one way (read by ps --plan)" if rpc else ""
        text = f"ping rank 0 -> rank {world - 1}: {res['rpc_ms']:.2f} ms{rate} ({took:.0f}s for the test)"
        out.append(Check("rpc", "OK", text))
    return out


def _best_peaks(old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """The higher rate (matmul peak, element-wise rate) per dtype, of the cached and the new figure: a peak is
    what one thread reaches when nothing else runs, and a doctor over more ranks than cores measures it beside
    busy ranks (4 ranks on 2 cores here: 0.057 TFLOP/s against 0.074 over 2 ranks)."""
    return {k: max(v, old.get(k, 0.0)) for k, v in new.items()}


def check_link(measured: Path) -> list[Check]:
    """Fit the collective curves this node's local rank 0 measured (doctor_worker.py), cache them with its
    matmul peak under this host (the links not measured now, and ``estimate --measure``'s efficiency, stay; the
    best matmul peak seen so far is kept)."""
    if not measured.is_file():
        return [Check("link", "WARN", "the test measured no all-gather curve", "run `disttrain doctor` again")]
    m = json.loads(measured.read_text())
    links = {k: fit_links(c) for k, c in m["curves"].items()}
    for rpc in m.get("rpc", []):  # rank 0's node: its RPC links (ps --plan reads them)
        links["rpc_inter" if rpc["across_nodes"] else "rpc"] = fit_rpc_link(rpc)
    old = load_machine()
    old = old if old is not None and old.device == m["device"] else None
    unit_s = old.unit_overhead_s if old else 0.0
    if "fsdp_probe" in m and "intra" in links:
        from disttrain.jobs.framework_probe import unit_overhead

        unit_s = unit_overhead(m["fsdp_probe"], links["intra"])
    profile = MachineProfile(
        host=socket.gethostname(),
        device=m["device"],
        device_name=torch.cuda.get_device_name(0) if m["device"] == "cuda" else cpu_name(),
        cores=os.cpu_count() or 1,
        matmul_tflops=_best_peaks(old.matmul_tflops if old else {}, m.get("matmul_tflops", {})),
        elementwise_rate=_best_peaks(old.elementwise_rate if old else {}, m.get("elementwise_rate", {})),
        # the latest fit per kind, and each collective's also under kind@ranks (a plan for that many ranks prefers it)
        links={
            **(old.links if old else {}),
            **links,
            **{f"{k}@{f.nranks}": f for k, f in links.items() if not k.startswith("rpc")},
        },
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        efficiency=old.efficiency if old else {},
        efficiency_runs=old.efficiency_runs if old else {},
        op_overhead_s=float(m.get("op_overhead_s", old.op_overhead_s if old else 0.0)),
        unit_overhead_s=unit_s,
        nodes_sharing_cores=next(
            (int(r["nodes_sharing_cores"]) for r in m.get("rpc", []) if "nodes_sharing_cores" in r),
            old.nodes_sharing_cores if old else 1,
        ),
    )
    data = profile.to_json()
    try:
        data["cache"] = str(save_machine(profile))
    except OSError as e:
        fix = "set DISTTRAIN_CACHE_DIR to a writable folder (disttrain estimate reads the figures from there)"
        return [Check("link", "WARN", f"{_link_text(profile, links)}; cannot cache it ({e})", fix, data)]
    text = f"{_link_text(profile, links)}; cached in {data['cache']} (read by disttrain estimate)"
    return [Check("link", "OK", text, "", data)]


def _link_text(profile: MachineProfile, measured: dict[str, LinkFit]) -> str:
    """'all-gather over 2 ranks: latency 85 us, 0.91 GB/s; reaches 80% of it from 2.0 MiB; matmul ...'."""
    from disttrain.utils.fmt import fmt_bytes, fmt_rate

    parts = []
    for key, where in (("intra", "over {n} ranks"), ("inter", "across {n} nodes")):
        if (f := measured.get(key)) is not None:
            reach = fmt_bytes(f.size_for(0.8, f.nranks), 1)
            parts.append(
                f"all-gather {where.format(n=f.nranks)}: latency {f.latency_s * 1e6:.0f} us, "
                f"{fmt_rate(f.bandwidth_Bps)}; reaches 80% of it from {reach}"
            )
            rates = ", ".join(f"{k.replace('_', '-')} {fmt_rate(bw)}" for k, (_, bw) in sorted(f.by_kind.items()))
            parts[-1] += f" ({rates} as rings)" if rates else ""
    parts = parts or ["one rank: no link to measure"]
    per = "1 thread" if profile.device == "cpu" else "the GPU"
    flops = ", ".join(f"{k} {v:.3g}" for k, v in profile.matmul_tflops.items())
    rates = ", ".join(f"{k} {v / 1e9:.2g}" for k, v in profile.elementwise_rate.items())
    parts.append(f"matmul {flops} TFLOP/s ({per})" if flops else "no matmul figure")
    parts += [f"element-wise {rates} G elements/s"] if rates else []
    if profile.op_overhead_s:
        parts.append(f"{profile.op_overhead_s * 1e6:.1f} us per operator")
    if profile.unit_overhead_s:
        parts.append(f"FSDP {profile.unit_overhead_s * 1e3:.2f} ms per unit pass")
    return "; ".join(parts)


MAX_SKEW_S = 1.0
"""Clocks further apart than this make logs, heartbeats and checkpoint times across nodes misleading."""


def check_nodes(res: dict[str, Any]) -> list[Check]:
    """Clocks and inter- vs intra-node bandwidth, from node 0's figures (several nodes only)."""
    if "nodes" not in res:
        return []
    skew = res["clock_skew_s"]
    bad = skew > MAX_SKEW_S
    out = [
        Check(
            "clocks",
            "WARN" if bad else "OK",
            f"{res['nodes']} nodes agree within {skew * 1e3:.1f} ms",
            "sync the clocks (chrony / NTP) on every node" if bad else "",
        )
    ]
    inter, intra = res.get("inter_all_reduce"), res.get("intra_all_reduce")
    if inter is not None:
        vs = f"; within a node {intra:.2f} GB/s ({intra / inter:.1f}x)" if intra else ""
        slow = inter < SLOW_GBPS["gloo"]
        out.append(
            Check(
                "inter-node",
                "WARN" if slow else "OK",
                f"all-reduce across nodes {inter:.2f} GB/s{vs}",
                "slow link between nodes: check the interface torchrun uses (--local-addr, "
                "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) and the network"
                if slow
                else "",
            )
        )
    return out


def check_cluster(cluster: Cluster | None) -> Check:
    """Which scheduler's environment this is: a PyTorchJob or JobSet pod (its variables give the nodes, the
    node rank and the rendezvous), or none."""
    if cluster is None:
        return Check("cluster", "OK", "not in a PyTorchJob or JobSet pod: nodes come from --nnodes, --node-rank")
    return Check("cluster", "OK", f"in {cluster.describe()}")


# -- the command --------------------------------------------------------------------------------------------
def run_checks(
    nproc: int | None = None,
    nnodes: str = "1",
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    port: int | None = None,
    quick: bool = False,
) -> list[Check]:
    checks = [check_python(), check_torch(), *check_cuda(), check_host(), *check_backends()]
    cluster = detect()
    if cluster is not None:  # in a pod: its operator's nodes, node rank and rendezvous, as `run` takes them
        launch = in_cluster(LaunchConfig(nnodes, node_rank, rdzv_endpoint), cluster)
        nnodes, node_rank, rdzv_endpoint = launch.nnodes, launch.node_rank, launch.rdzv_endpoint
        nproc = nproc or cluster.nproc
    checks.append(check_cluster(cluster))
    if port is not None:
        checks.append(check_port(port, "asked for"))
    elif rdzv_endpoint is None:
        default = int(os.environ.get("MASTER_PORT", 29500))  # only matters to scripts that set it themselves
        checks.append(check_port(default, "torchrun's default MASTER_PORT", severity="WARN"))
    checks += check_rendezvous(rdzv_endpoint, node_rank)
    if not quick and not any(c.status == "FAIL" for c in checks):
        from disttrain.launch.torchrun import default_nproc

        n = nproc or default_nproc("cuda" if torch.cuda.is_available() else "cpu")
        checks += check_multiprocess(n, nnodes, node_rank, rdzv_endpoint)
    return checks


def report(checks: list[Check], as_json: bool) -> int:
    failed = any(c.status == "FAIL" for c in checks)
    if as_json:
        rows = [{k: v for k, v in dataclasses.asdict(c).items() if k != "data" or v} for c in checks]
        print(json.dumps({"ok": not failed, "checks": rows}, indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
            if c.fix:
                print(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
        print("ready" if not failed else "NOT ready: fix the FAIL lines above")
    return 1 if failed else 0
