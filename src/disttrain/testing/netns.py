"""Two hosts on one machine, for the multi-node tests and benchmarks: two network namespaces joined by a veth
pair, each with its own address in a private test subnet that exists only inside them. Each host runs its own
`disttrain` launcher; nothing is sent outside the namespaces. Needs root and iproute2 (`ip`); :func:`why_not`
says why it cannot run."""

from __future__ import annotations

import functools
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

    def cmd(self, *args: str, ahead: bool = False) -> list[str]:
        """``args`` run on this host; ``ahead``: before any other work of this machine, as on a node of its own
        (a job whose speed a test compares with a plan for free cores): see :func:`ahead_of_the_rest`."""
        alone = ["unshare", "--pid", "--fork", "--kill-child"] if self.own_pids else []
        return ["ip", "netns", "exec", self.ns, *(ahead_of_the_rest() if ahead else []), *alone, *args]

    def disttrain(self, *args: str, env: dict[str, str] | None = None, ahead: bool = False) -> subprocess.Popen[str]:
        """The real `disttrain` command on this host, in a process group of its own (to kill it whole)."""
        cmd, env = self.cmd(str(DISTTRAIN), *args, ahead=ahead), child_env(extra=env)
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


@functools.cache
def ahead_of_the_rest() -> list[str]:
    """The prefix that runs a command and its children before this machine's other work: real-time round robin
    (``chrt -r 1``, root), which every process it starts inherits. A nice value would not do: the kernel's
    autogroups share the CPU between sessions first, and torchrun starts each worker in a session of its own.
    Where real-time scheduling is refused (a container without it), ``nice -n -15``, the best left."""
    if subprocess.run(["chrt", "-r", "1", "true"], capture_output=True).returncode == 0:
        return ["chrt", "-r", "1"]
    return ["nice", "-n", "-15"]


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
