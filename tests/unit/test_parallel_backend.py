"""Which collective library tensor parallelism uses, by device (parallel.py): NCCL between
GPUs, gloo between CPU processes. The group's join is recorded by a fake of
`init_process_group` (no process group is made here; test_tensor_parallel.py runs gloo's)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from wok_runtime.core import parallel
from wok_runtime.core.parallel import Parallel, backend_for, join_group


def test_gpus_use_nccl_and_cpus_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel.dist, "is_nccl_available", lambda: True)
    assert backend_for(torch.device("cuda", 1)) == "nccl"
    assert backend_for(torch.device("cpu")) == "gloo"


def test_cuda_without_nccl_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel.dist, "is_nccl_available", lambda: False)
    with pytest.raises(ValueError, match="needs NCCL"):
        backend_for(torch.device("cuda", 0))
    with pytest.raises(ValueError, match="cuda or cpu, not meta"):
        backend_for(torch.device("meta"))


@pytest.mark.parametrize(
    ("device", "backend", "device_id"),
    [
        (torch.device("cuda", 1), "nccl", torch.device("cuda", 1)),
        (torch.device("cpu"), "gloo", None),
    ],
)
def test_a_rank_joins_with_its_devices_backend(
    monkeypatch: pytest.MonkeyPatch, device: torch.device, backend: str, device_id: Any
) -> None:
    joined: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(parallel.dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(parallel.dist, "init_process_group", lambda b, **kw: joined.append((b, kw)))
    join_group(Parallel(1, 2), 29500, device)
    ((got, kw),) = joined
    assert got == backend and kw["device_id"] == device_id
    assert kw["rank"] == 1 and kw["world_size"] == 2
    assert kw["init_method"] == "tcp://127.0.0.1:29500"
