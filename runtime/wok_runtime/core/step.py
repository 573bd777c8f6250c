"""The seam between the engine and what runs a step: the scheduler's plan in, one token per
sequence out.

Two kinds of executors sit behind it: `SampledStep` (sampled_step.py: the PyTorch model runner's
logits, then the sampler) and `SimModelRunner` (sim_runner.py: the simulated accelerator, which
sleeps the step's profiled time and draws tokens from a seeded generator). Torch-free, so the
engine imports neither kind unless it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from wok_runtime.core.scheduler import SchedulerOutput
    from wok_runtime.core.sequence import Sequence


@dataclass(frozen=True)
class StepTokens:
    """A step's result: the token of every scheduled sequence that samples this step (a prefill
    chunk that does not reach the prompt's end samples none), or why it failed."""

    sampled: dict[Sequence, int]
    failed: dict[Sequence, str]


@runtime_checkable
class StepExecutor(Protocol):
    def execute(self, batch: SchedulerOutput) -> StepTokens:
        """Runs the planned step (blocking for as long as the step takes)."""
        ...

    def release(self, request_id: str) -> None:
        """Forgets per-request state (a sampling generator) once the request has finished."""
        ...
