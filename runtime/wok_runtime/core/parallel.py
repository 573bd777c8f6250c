"""Tensor parallelism, Megatron-style: one model split over the GPUs of a pod.

Each rank holds 1/N of the attention heads (query and KV) and 1/N of the MLP's intermediate
columns; the projections that leave them (attention's `o_proj`, the MLP's `down_proj`) hold the
matching 1/N of their input columns, so each rank's output is a partial sum of the full one, and
one all-reduce after each makes every rank's residual stream whole again. Embeddings, norms and
the LM head are replicated (cheap next to the layers, and no all-gather of logits is needed).

The ranks are processes: rank 0 runs the engine and samples; ranks 1..N-1 are spawned workers
that receive each step's inputs from rank 0 (`torch.distributed` broadcast) and run the same
forward on their shard, their own KV pool holding their KV heads. NCCL on CUDA, gloo on the CPU
(so that it runs, and is tested, here).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from wok_runtime.core.model_config import ModelConfig

log = logging.getLogger(__name__)

# How long a rank waits for the others to join or answer (a worker that died shows as this).
TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class Parallel:
    """This process's place in the tensor-parallel group (rank 0 of 1: no parallelism)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside [0, {self.size})")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums the ranks' partial outputs, in place; every rank gets the whole."""
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def shard(self, tensor: torch.Tensor, dim: int | None) -> torch.Tensor:
        """This rank's contiguous 1/N of `tensor` along `dim` (None: replicated, all of it)."""
        if dim is None or self.size == 1:
            return tensor
        return tensor.chunk(self.size, dim)[self.rank]


SINGLE = Parallel()


def check_divisible(config: ModelConfig, size: int) -> None:
    """Heads and MLP columns must split evenly (KV heads are split, never replicated)."""
    if size < 1:
        raise ValueError(f"tensor-parallel size must be at least 1, got {size}")
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(config, name) % size:
            raise ValueError(
                f"tensor parallelism over {size} GPUs needs {name} ({getattr(config, name)}) "
                f"to be a multiple of {size}"
            )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: torch.device) -> str:
    """The collective library for ranks on `device`: NCCL between GPUs (its all-reduce runs on
    the GPUs, over NVLink where there is one), gloo between CPU processes."""
    if device.type == "cuda":
        if not dist.is_nccl_available():
            raise ValueError(
                "tensor parallelism on CUDA needs NCCL, and this torch build has none "
                "(install torch built for CUDA with NCCL)"
            )
        return "nccl"
    if device.type == "cpu":
        return "gloo"
    raise ValueError(f"tensor parallelism runs on cuda or cpu, not {device.type}")


def join_group(parallel: Parallel, port: int, device: torch.device) -> None:
    """Joins the group on loopback (every rank of a pod is on one host); rank 0 hosts the
    rendezvous. On CUDA the rank's GPU is bound to the group (`device_id`), so NCCL sets up
    its communicator at once rather than at the first collective."""
    backend = backend_for(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=parallel.rank,
        world_size=parallel.size,
        timeout=TIMEOUT,
        device_id=device if backend == "nccl" else None,
    )


def rank_device(device: torch.device, parallel: Parallel) -> torch.device:
    """Rank r drives GPU r of the pod."""
    if device.type != "cuda":
        return device
    torch.cuda.set_device(parallel.rank)
    return torch.device("cuda", parallel.rank)


def broadcast_step(inputs: Any) -> Any:
    """Rank 0 sends a step's inputs (None: stop), the other ranks receive them."""
    box = [inputs]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def spawn_workers(
    size: int,
    port: int,
    worker: Callable[[Parallel, int, int, dict[str, Any]], None],
    runner_kwargs: dict[str, Any],
) -> list[Any]:
    """Ranks 1..size-1 as daemon processes (they end with rank 0), each running
    `worker(parallel, port, threads, runner_kwargs)` (`model_runner.run_worker`: passed in, so
    that this module, below the model, never imports the runner)."""
    context = torch.multiprocessing.get_context("spawn")
    threads = torch.get_num_threads()
    workers = [
        context.Process(
            target=worker,
            args=(Parallel(rank, size), port, threads, runner_kwargs),
            daemon=True,
        )
        for rank in range(1, size)
    ]
    for process in workers:
        process.start()
    return workers


def leave_group() -> None:
    dist.destroy_process_group()
