"""Loopback-only networking helpers: traffic may go to 127.0.0.0/8 and nowhere else."""

from __future__ import annotations

import ipaddress
import random
import socket
from pathlib import Path

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out; every run picks its own, so runs never collide."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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


def pick_pod_octet() -> int:
    """A free X for this cluster's pod network 127.X.0.0/16.

    Several clusters run on one machine (a test session, `wok dev`, another engineer's tests);
    sharing one pod network would put two pods on the same IP:port. X is random (2..254) and
    skips networks where something is already listening.
    """
    busy = _busy_second_octets() | {0, 1}
    choices = [x for x in range(2, 255) if x not in busy]
    if not choices:
        raise RuntimeError("no free 127.X.0.0/16 pod network")
    return random.choice(choices)
