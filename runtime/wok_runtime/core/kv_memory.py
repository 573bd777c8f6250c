"""The KV pool's size against the room the runtime measured for it: the record the metrics
export and the check the log warns on.

Why: on a GPU pod the operator sizes the pool from its memory budget (`--kv-cache-bytes`), a
model of the device; the runtime sees the device itself. When the two disagree by more than
`KV_BUDGET_TOLERANCE`, the budget's inputs (GPU memory, weights, activation peak) are wrong for
this node, and someone should know: the runtime logs both figures and exports them
(`wok_kv_cache_budget_bytes`, `wok_kv_cache_measured_bytes`). It still uses the budget: the
operator's batch cap was computed from it.

Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

#: How far the measured room may be from the budget before the runtime says so.
KV_BUDGET_TOLERANCE = 0.10


@dataclass(frozen=True)
class KvMemory:
    """`budget_bytes`: the pool the runtime was given (`--kv-cache-bytes`, on a pod the
    operator's budget) or chose. `measured_bytes`: the room it measured once the weights were
    loaded: on CUDA total × gpu_memory_utilization − memory in use − the largest step's
    activation peak; on the CPU its default share of the available host memory."""

    device: str
    budget_bytes: int
    measured_bytes: int

    def differs(self, tolerance: float = KV_BUDGET_TOLERANCE) -> bool:
        """Whether the measured room is more than `tolerance` of the budget away from it."""
        return abs(self.measured_bytes - self.budget_bytes) > tolerance * self.budget_bytes
