"""One engine step on a logits runner (the PyTorch `ModelRunner`): forward, then sample.

Why apart from the engine: it is the engine's only torch code. The engine plans steps and keeps
request state in pure Python; a runner that picks its tokens itself (the simulated accelerator,
`sim_runner.py`) replaces this module, so a sim pod never imports torch.

Robustness is per request: a row of non-finite logits fails only its request, and an exception in
a whole forward is retried per sequence to find the culprit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import torch

from wok_runtime.core.model_runner import StepInput
from wok_runtime.core.sampler import Sampler
from wok_runtime.core.step import StepTokens

if TYPE_CHECKING:
    from wok_runtime.core.scheduler import ScheduledSeq, SchedulerOutput
    from wok_runtime.core.sequence import Sequence

log = logging.getLogger(__name__)


class LogitsRunner(Protocol):
    def forward(self, inputs: list[StepInput]) -> torch.Tensor: ...


class SampledStep:
    """`execute` and `release` of `wok_runtime.core.step.StepExecutor` over a logits runner."""

    def __init__(self, runner: LogitsRunner) -> None:
        self.runner = runner
        self.sampler = Sampler()

    def release(self, request_id: str) -> None:
        self.sampler.release(request_id)

    def execute(self, batch: SchedulerOutput) -> StepTokens:
        logits, failed = self._forward(batch.scheduled)
        sampled: dict[Sequence, int] = {}
        rows = [
            i for i, item in enumerate(batch.scheduled) if item.samples and item.seq not in failed
        ]
        if not rows:
            return StepTokens(sampled, failed)
        try:
            assert logits is not None
            items = [batch.scheduled[i] for i in rows]
            picked = logits if len(rows) == len(batch.scheduled) else logits[rows]
            tokens = self.sampler.sample(
                picked, [(it.seq.request_id, it.seq.params) for it in items]
            )
            for item, token in zip(items, tokens, strict=True):
                if token is None:
                    failed[item.seq] = "the model produced non-finite logits (NaN or inf)"
                else:
                    sampled[item.seq] = token
        except Exception as error:  # a sampler bug must not kill the loop either
            log.exception("sampling failed")
            for i in rows:
                failed[batch.scheduled[i].seq] = f"sampling failed: {error!r}"
        return StepTokens(sampled, failed)

    def _forward(
        self, scheduled: list[ScheduledSeq]
    ) -> tuple[torch.Tensor | None, dict[Sequence, str]]:
        """Runs the step; on an exception, runs each sequence alone so that only the culprit
        fails (rewriting the same K/V slots again is harmless)."""
        inputs = [
            StepInput(
                token_ids=it.token_ids, start_pos=it.start_pos, block_table=list(it.seq.block_table)
            )
            for it in scheduled
        ]
        try:
            return self.runner.forward(inputs), {}
        except Exception:
            log.exception("a step of %d sequences failed; retrying them one by one", len(inputs))
        failed: dict[Sequence, str] = {}
        rows: list[torch.Tensor | None] = []
        for item, one in zip(scheduled, inputs, strict=True):
            try:
                rows.append(self.runner.forward([one])[0])
            except Exception as error:
                failed[item.seq] = f"the model step failed: {error!r}"
                rows.append(None)
        good = [r for r in rows if r is not None]
        if not good:
            return None, failed
        filler = torch.full_like(good[0], float("nan"))
        return torch.stack([filler if r is None else r for r in rows]), failed
