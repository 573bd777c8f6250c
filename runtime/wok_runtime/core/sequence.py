"""One request's state as it moves through the queue, the scheduler and the model.

Pure Python (no torch): the scheduler, block manager and queue all work on `Sequence` objects, so
they are tested in milliseconds. The token list holds the prompt followed by the generated tokens;
`num_computed_tokens` says how many of them already have their K/V in the cache. Preemption by
recompute simply sets it back to zero: the generated tokens stay and are recomputed as prompt.

A sequence belongs to one of two lanes: `online` (the latency-bound traffic the operator scales
for) or `batch` (offline work served only from the capacity the online lane leaves free).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from wok_runtime.core.sampling_params import SamplingParams

Lane = Literal["online", "batch"]
LANES: tuple[Lane, ...] = ("online", "batch")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class RequestMetrics:
    """A snapshot of one request's timings (monotonic seconds; None until the event happens)."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int


@dataclass(eq=False)
class Sequence:
    """Per-request state. Identity (not value) equality: two requests are never the same."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 1
    tenant: str | None = None
    lane: Lane = "online"
    # Absolute monotonic time after which a still-waiting request expires (None = never).
    queue_deadline: float | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # The prefix cache's chained hashes of the full blocks of `token_ids` (block_manager.py),
    # computed once: tokens are only appended, so they stay valid through a preemption.
    block_hashes: list[bytes] = field(default_factory=list)
    # How many output tokens were already handed to the caller (for incremental outputs).
    num_emitted_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_batch(self) -> bool:
        return self.lane == "batch"

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, now: float) -> None:
        self.token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now

    def metrics(self) -> RequestMetrics:
        return RequestMetrics(
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            first_token_time=self.first_token_time,
            last_token_time=self.last_token_time,
            finished_time=self.finished_time,
            num_prompt_tokens=self.num_prompt_tokens,
            num_output_tokens=self.num_output_tokens,
            num_preemptions=self.num_preemptions,
        )
