"""Two hosts on one machine, for the multi-node tests and benchmarks: two network namespaces joined by a veth
pair, each with its own address in a private test subnet that exists only inside them. Each host runs its own
`disttrain` launcher; nothing is sent outside the namespaces. Needs root and iproute2 (`ip`); :func:`why_not`
says why it cannot run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from disttrain.testing.launch import DISTTRAIN, child_env


def why_not() -> str | None:
    """None when namespaces can be made here, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2): apt-get install iproute2"
    probe = subprocess.run(["ip", "netns", "add", f"dtprobe{os.getpid()}"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"dtprobe{os.getpid()}"], capture_output=True)
    return None


@dataclass
class Host:
    ns: str
    addr: str
    veth: str
    own_pids: bool = False
    """Each command in a PID namespace of its own: TensorPipe (torch RPC) then sees other hosts' processes as
    remote and sends tensors over the network, not by cross-memory attach, which a shared PID namespace allows
    (and which would bypass a rate-limited link)."""

    def cmd(self, *args: str) -> list[str]:
        alone = ["unshare", "--pid", "--fork", "--kill-child"] if self.own_pids else []
        return ["ip", "netns", "exec", self.ns, *alone, *args]

    def disttrain(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """The real `disttrain` command on this host, in a process group of its own (to kill it whole)."""
        cmd, env = self.cmd(str(DISTTRAIN), *args), child_env(extra=env)
        pipe = subprocess.PIPE
        return subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True)

    def kill_all(self) -> None:
        """The host dies: SIGKILL to every process in its namespace (launcher and workers alike)."""
        pids = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def link(self, up: bool) -> None:
        subprocess.run(self.cmd("ip", "link", "set", self.veth, "up" if up else "down"), check=True)

    def limit(self, rate: str) -> None:
        """What this host sends leaves at ``rate`` (tc's token bucket, e.g. '20mbit'), as over a slow link: a
        burst of one packet's worth, packets waiting at most 200 ms for their turn."""
        tbf = ["tbf", "rate", rate, "burst", "16kb", "latency", "200ms"]
        subprocess.run(self.cmd("tc", "qdisc", "replace", "dev", self.veth, "root", *tbf), check=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def two_hosts(own_pids: bool = False) -> Iterator[tuple[Host, Host]]:
    """Hosts A (10.X.Y.1) and B (10.X.Y.2), removed afterwards even when the test fails; ``own_pids``: see
    :attr:`Host.own_pids`."""
    tag = os.getpid() % 100_000
    net = f"10.{200 + tag % 50}.{tag % 250}"
    a = Host(f"dt{tag}a", f"{net}.1", f"dt{tag}va", own_pids)
    b = Host(f"dt{tag}b", f"{net}.2", f"dt{tag}vb", own_pids)
    try:
        for h in (a, b):
            _ip("netns", "add", h.ns)
        _ip("link", "add", a.veth, "type", "veth", "peer", "name", b.veth)
        for h in (a, b):
            _ip("link", "set", h.veth, "netns", h.ns)
            _ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.veth)
            _ip("-n", h.ns, "link", "set", h.veth, "up")
            _ip("-n", h.ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for h in (a, b):
            h.kill_all()
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
