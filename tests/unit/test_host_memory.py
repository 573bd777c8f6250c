"""The default CPU KV pool: a share of the available host memory, capped, and "available" is
the smaller of MemAvailable and the memory cgroup's room (v2, v1, a hybrid host's unified/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wok_runtime.core.host_memory import (
    CPU_KV_CAP_BYTES,
    CPU_KV_FRACTION,
    available_bytes,
    default_cpu_kv_bytes,
)

GIB = 1 << 30


def test_the_default_is_a_share_of_free_memory_capped() -> None:
    assert default_cpu_kv_bytes(2 * GIB) == int(2 * GIB * CPU_KV_FRACTION)
    assert default_cpu_kv_bytes(512 * GIB) == CPU_KV_CAP_BYTES
    assert default_cpu_kv_bytes(0) == 0
    with pytest.raises(ValueError, match=">= 0"):
        default_cpu_kv_bytes(-1)


@pytest.mark.parametrize(
    ("cgroup", "sys_files", "expected"),
    [
        pytest.param(
            "0::/\n", {"memory.max": "max", "memory.current": "1000"}, 32 * GIB, id="v2-no-limit"
        ),
        pytest.param(
            "0::/pod\n",
            {"pod/memory.max": f"{8 * GIB}", "pod/memory.current": f"{3 * GIB}"},
            5 * GIB,
            id="v2-limit",
        ),
        pytest.param(
            "4:memory:/job\n0::/\n",
            {
                "memory/job/memory.limit_in_bytes": f"{2 * GIB}",
                "memory/job/memory.usage_in_bytes": f"{GIB}",
                "unified/memory.max": "max",
            },
            GIB,
            id="v1-limit-on-a-hybrid-host",
        ),
        pytest.param(
            "4:memory:/host/path/of/the/container\n",
            {
                "memory/memory.limit_in_bytes": f"{2 * GIB}",
                "memory/memory.usage_in_bytes": f"{GIB // 2}",
            },
            GIB + GIB // 2,
            id="v1-container-without-a-cgroup-namespace",
        ),
        pytest.param(
            "4:memory:/\n",
            {
                "memory/memory.limit_in_bytes": "9223372036854771712",
                "memory/memory.usage_in_bytes": "1",
            },
            32 * GIB,
            id="v1-no-limit",
        ),
    ],
)
def test_available_is_the_smaller_of_mem_available_and_the_cgroup_room(
    tmp_path: Path, cgroup: str, sys_files: dict[str, str], expected: int
) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")
    (tmp_path / "cgroup").write_text(cgroup)
    for name, text in sys_files.items():
        path = tmp_path / "sys" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    found = available_bytes(
        meminfo=tmp_path / "meminfo",
        self_cgroup=tmp_path / "cgroup",
        cgroup_root=tmp_path / "sys",
    )
    assert found == expected


def test_this_machine_reports_a_positive_figure() -> None:
    assert available_bytes() > 0
