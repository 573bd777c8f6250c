"""The engine's configuration records, torch-free so the scheduler and the server can share them.

`EngineConfig` is fixed at start; `BatchingParams` is the live, adjustable part that the admin API
reads and writes (the operator's control loop moves `max_batch_size`; an admin may move the step
token budget `max_num_batched_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Mode = Literal["continuous", "static", "serial"]
MODES: tuple[Mode, ...] = ("continuous", "static", "serial")


@dataclass(frozen=True)
class EngineConfig:
    """`mode`: continuous (iteration-level batching), static (a batch forms when
    `max_batch_size` requests wait or the oldest waited `max_wait_ms`, then runs to completion)
    or serial (one request at a time). `max_wait_ms` only matters in static mode.

    `max_model_len=None` takes the runner's. `queue_timeout_s` is the longest a request may wait
    for admission (a request may ask for less, never more). `tenant_kv_share` caps the share of
    KV blocks one tenant may hold (1.0 = no cap). `stream_interval`: after the first token, an
    incremental output waits until it has this many new tokens (or the request ends), as vLLM's
    `--stream-interval`: fewer, larger stream chunks, for a fraction of the host work.

    The batch lane (scheduler.py) has its own bounded queue (`batch_max_queue`), so an offline
    backlog never fills the online queue, and its own wait limit (`batch_queue_timeout_s`:
    offline work expects to wait behind the online lane). `batch_lane_max_batch_size` caps the
    batch lane while the online lane is idle (None: the memory cap, `kv_safe_batch_size`).

    `enable_prefix_caching` (on by default, as in vLLM): a request reuses the K/V blocks of the
    longest prompt prefix an earlier one computed, and computes only the rest
    (block_manager.py).
    """

    mode: Mode = "continuous"
    max_batch_size: int = 32
    max_wait_ms: int = 0
    max_num_batched_tokens: int = 2048
    max_queue: int = 256
    queue_timeout_s: float = 30.0
    max_model_len: int | None = None
    aging_s: float = 10.0
    tenant_kv_share: float = 1.0
    stream_interval: int = 1
    batch_max_queue: int = 1024
    batch_queue_timeout_s: float = 3600.0
    batch_lane_max_batch_size: int | None = None
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {self.max_queue}")
        if not (self.queue_timeout_s > 0):  # also rejects NaN
            raise ValueError(f"queue_timeout_s must be > 0, got {self.queue_timeout_s}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not math.isfinite(self.aging_s) or self.aging_s < 0:
            raise ValueError(f"aging_s must be >= 0 (0 = no aging), got {self.aging_s}")
        if not 0.0 < self.tenant_kv_share <= 1.0:
            raise ValueError(f"tenant_kv_share must be in (0, 1], got {self.tenant_kv_share}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.batch_max_queue < 1:
            raise ValueError(f"batch_max_queue must be >= 1, got {self.batch_max_queue}")
        if not (self.batch_queue_timeout_s > 0):  # also rejects NaN
            raise ValueError(f"batch_queue_timeout_s must be > 0, got {self.batch_queue_timeout_s}")
        if self.batch_lane_max_batch_size is not None and self.batch_lane_max_batch_size < 1:
            raise ValueError(
                f"batch_lane_max_batch_size must be >= 1, got {self.batch_lane_max_batch_size}"
            )


@dataclass(frozen=True)
class BatchingParams:
    """The live batching parameters, as in effect (after clamping).

    `capacity`: the ceiling for `max_batch_size`, the number of KV blocks (a running sequence
    holds at least one). `kv_safe_batch_size`: how many `max_model_len` sequences the pool holds;
    up to it preemption cannot happen, above it the pool is overcommitted (preemption by
    recompute absorbs the overflow when sequences grow long). `batch_lane_max_batch_size`: the
    batch lane's cap while the online lane is idle (clamped to `capacity`).
    `max_num_batched_tokens_limit`: the ceiling for `max_num_batched_tokens`, the step the model
    runner sized its activations for.
    """

    max_batch_size: int
    max_wait_ms: int
    max_num_batched_tokens: int
    mode: Mode
    capacity: int
    kv_safe_batch_size: int = 0
    batch_lane_max_batch_size: int = 0
    max_num_batched_tokens_limit: int = 0
