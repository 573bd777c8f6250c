"""How much host memory the runtime may take for a KV pool on the CPU, when nobody said.

Why a module of its own: on a GPU the pool is sized from the device's free memory, but on the
CPU there is no such figure, and a newcomer's `wok runtime serve --model builtin:tiny` should
start rather than ask for `--kv-cache-bytes`. Like vLLM's CPU backend (whose KV space is a
setting, `VLLM_CPU_KVCACHE_SPACE`), the default is a fixed share of what is left, capped: a
quarter of the memory available once the weights are loaded, at most 4 GiB. "Available" is the
smaller of the kernel's MemAvailable and what the process's memory cgroup still allows (limit
minus usage, cgroup v2 or v1), so a container never sizes its pool from the node's memory.

Pure Python (no torch): reads /proc and /sys, whose paths tests may point elsewhere.
"""

from __future__ import annotations

from pathlib import Path

#: The share of available host memory a default CPU KV pool takes.
CPU_KV_FRACTION = 0.25
#: The most a default CPU KV pool takes, however much memory is free.
CPU_KV_CAP_BYTES = 4 << 30
#: cgroup v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages); anything above this
#: is no limit.
_NO_LIMIT = 1 << 60


def default_cpu_kv_bytes(available_bytes: int) -> int:
    """The default KV pool on the CPU for `available_bytes` of free host memory."""
    if available_bytes < 0:
        raise ValueError(f"available memory must be >= 0, got {available_bytes}")
    return min(int(available_bytes * CPU_KV_FRACTION), CPU_KV_CAP_BYTES)


def available_bytes(
    *,
    meminfo: Path = Path("/proc/meminfo"),
    self_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> int:
    """Host memory this process may still use: MemAvailable, or less if its cgroup says so."""
    figures = [_mem_available(meminfo)]
    room = _cgroup_room(self_cgroup, cgroup_root)
    if room is not None:
        figures.append(room)
    return max(0, min(figures))


def _mem_available(meminfo: Path) -> int:
    for line in meminfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            return int(value.split()[0]) * 1024  # kB
    raise ValueError(f"no MemAvailable in {meminfo}")


def _cgroup_room(self_cgroup: Path, root: Path) -> int | None:
    """limit − usage of the process's memory cgroup (v2 or v1); None without a limit."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    candidates: list[tuple[Path, str, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        # Without a cgroup namespace a container sees the host's path here while its own cgroup
        # is mounted at the root of the hierarchy: the mount's root is a candidate too.
        if controllers == "":  # cgroup v2 (unified; under unified/ on a hybrid host)
            for base in (root, root / "unified"):
                for directory in {base / rel, base}:
                    candidates.append((directory, "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):
            for directory in {root / "memory" / rel, root / "memory"}:
                candidates.append((directory, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    rooms = []
    for directory, limit_name, usage_name in candidates:
        try:
            limit_text = (directory / limit_name).read_text().strip()
            usage = int((directory / usage_name).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= _NO_LIMIT:
            continue
        rooms.append(int(limit_text) - usage)
    return min(rooms, default=None)
