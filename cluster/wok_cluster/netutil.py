"""Loopback-only networking helpers: traffic may go to 127.0.0.0/8 and nowhere else (and to the
harness's own addresses on `lo`, see HOST_LOCAL_NETWORK)."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
import subprocess
from pathlib import Path

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


# Servers listen below the kernel's ephemeral range (32768-60999 by default), on a random free port:
# outgoing connections never take one of these, and the kernel's own pick for bind(0) handed the
# same just-freed port to two pytest workers starting their clusters at once (one etcd failed to
# bind). Each xdist worker draws from its own slice, so workers of one run never pick alike.
LISTEN_PORTS = range(20000, 32768)
_draw = random.SystemRandom()  # independent of any seed a test sets
_handed: set[int] = set()  # never twice in one process: a port handed out may not be bound yet


def listen_ports() -> range:
    """This process's share of LISTEN_PORTS: a slice per pytest-xdist worker, else all of it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest-xdist
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or workers < 2:
        return LISTEN_PORTS
    size = len(LISTEN_PORTS) // workers
    index = int(worker.removeprefix("gw")) % workers
    return LISTEN_PORTS[index * size : (index + 1) * size]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server this run starts next."""
    ports = listen_ports()
    for _ in range(200):
        port = _draw.choice(ports)
        if port in _handed:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed.add(port)
        return port
    raise RuntimeError(f"no free port in {ports.start}..{ports.stop - 1} after 200 tries")


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in LOOPBACK
    except ValueError:
        return False


def require_loopback(address: str) -> str:
    """Returns `address` if it is in 127.0.0.0/8; raises otherwise (never connect elsewhere)."""
    if not is_loopback(address):
        raise ValueError(f"refusing to connect to {address!r}: only 127.0.0.0/8 is allowed")
    return address


def _busy_second_octets() -> set[int]:
    """Second octets of 127.X.*.* addresses that have TCP sockets bound right now."""
    busy = set()
    for table in ("/proc/net/tcp",):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            address = line.split()[1].split(":")[0]  # little-endian hex, e.g. 0100017F
            if address.endswith("7F"):
                busy.add(int(address[4:6], 16))
    return busy


# Where a cluster claims its pod network 127.X.0.0/16: a listening socket on 127.X.255.254, never a
# pod's address (nodes take 127.X.N.0/24 with N < MAX_NODES = 255). The port is fixed so that
# bind() itself is the claim: a second bind of the same address and port fails, atomically.
CLAIM_HOST = "255.254"
CLAIM_PORT = 65535


def claim_pod_octet() -> tuple[int, socket.socket]:
    """A free X for this cluster's pod network 127.X.0.0/16, and the socket that holds it.

    Several clusters run on one machine (the test workers of one run, `wok dev`, another
    engineer's tests); sharing one pod network would put two pods on the same IP:port. X is random
    (2..254), skips networks where something is already listening, and is claimed by a listening
    socket at once: two clusters that start together never take the same X, though their pods
    are not up yet. The claim lasts until the socket is closed (or its process ends).
    """
    busy = _busy_second_octets() | {0, 1}
    choices = [x for x in range(2, 255) if x not in busy]
    random.shuffle(choices)
    for octet in choices:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((f"127.{octet}.{CLAIM_HOST}", CLAIM_PORT))
        except OSError:  # another cluster's claim (or a server on every address at that port)
            sock.close()
            continue
        sock.listen()
        return octet, sock
    raise RuntimeError("no free 127.X.0.0/16 pod network")


# A private network for servers the apiserver must reach through an EndpointSlice, which refuses
# loopback addresses (KEDA's metrics adapter behind its APIService). Its addresses are put on `lo`
# one at a time (/32), so they are local to this machine like 127/8: nothing routes them anywhere
# else. Outside the Service CIDR (10.96.0.0/16), so no ClusterIP can ever equal one.
HOST_LOCAL_NETWORK = ipaddress.ip_network("10.255.0.0/16")
# `ip addr` shows the harness's addresses under this label (leftovers of a killed run included)
HOST_LOCAL_LABEL = "lo:wok"


def _host_addresses() -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines()}


def claim_host_address() -> str:
    """Adds a free address of HOST_LOCAL_NETWORK to `lo` and returns it (needs CAP_NET_ADMIN).

    Random, skipping addresses already on the machine; `ip addr add` refuses one that another run
    took in the meantime, so two runs never share an address. `release_host_address` removes it.
    """
    used = _host_addresses()
    hosts = list(HOST_LOCAL_NETWORK.hosts())
    for _ in range(20):
        candidate = str(random.choice(hosts))
        if candidate in used:
            continue
        result = subprocess.run(
            ["ip", "addr", "add", f"{candidate}/32", "dev", "lo", "label", HOST_LOCAL_LABEL],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            return candidate
        if "File exists" not in result.stderr:
            raise RuntimeError(f"cannot add {candidate}/32 to lo: {result.stderr.strip()}")
    raise RuntimeError(f"no free address in {HOST_LOCAL_NETWORK} after 20 tries")


def release_host_address(address: str) -> None:
    """Removes an address `claim_host_address` added (already gone: nothing to do)."""
    if ipaddress.ip_address(address) not in HOST_LOCAL_NETWORK:
        raise ValueError(f"{address} is not one of the harness's host addresses")
    subprocess.run(
        ["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True, check=False
    )
