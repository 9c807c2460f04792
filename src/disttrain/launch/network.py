"""Which address and interface this node uses to reach the others (multi-node jobs).

torchrun, gloo and TensorPipe each guess this node's address from its host name, which is wrong wherever
host names do not resolve to the interface between the nodes: containers, network namespaces, machines
with several networks. The answer here is the interface of the route to the rendezvous endpoint (a UDP
``connect`` asks the kernel; nothing is sent), handed to torchrun (``--local-addr``) and to the workers
(``GLOO_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME``) unless the user set them.
"""

from __future__ import annotations

import socket
from collections.abc import MutableMapping

import psutil

from disttrain.errors import ConfigError


def route_to(host: str, port: int) -> str:
    """This node's address on the route to ``host:port``."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError as e:
        raise ConfigError(
            f"launch.rdzv_endpoint {host}:{port}: no route from this node ({e.strerror or e}); "
            "give node 0's address as the other nodes reach it"
        ) from None


def interface_of(addr: str) -> str | None:
    """The name of the interface holding ``addr`` (None if no interface does)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == addr for a in addrs):
            return name
    return None


def is_local(host: str) -> bool:
    """Is ``host`` (a name or an address) one of this machine's addresses?"""
    try:
        return interface_of(socket.gethostbyname(host)) is not None
    except OSError:
        return False


def endpoint_parts(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"launch.rdzv_endpoint must be HOST:PORT, got {endpoint!r}")
    return host, int(port)


def set_interface_env(env: MutableMapping[str, str], local_addr: str) -> None:
    """Point gloo and TensorPipe at the interface holding ``local_addr`` (unless ``env`` already does); the
    workers learn this node's address as ``DISTTRAIN_NODE_ADDR`` (to name it when another node loses it)."""
    env["DISTTRAIN_NODE_ADDR"] = local_addr
    name = interface_of(local_addr)
    if name is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", name)
        env.setdefault("TP_SOCKET_IFNAME", name)
