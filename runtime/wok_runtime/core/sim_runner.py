"""The simulated accelerator (`wok runtime serve --device sim --profile NAME|PATH`).

Why: fleet-scale runs (the emulated cluster with 20-50 "GPU" pods, KEDA beside wok) need pods
that behave like GPU pods in time, on a machine without GPUs. Everything else is the real runtime
(HTTP API, queue, scheduler, KV block manager, metrics, admin API); only the forward pass is
replaced: for the batch the scheduler actually planned, the step sleeps the profile's step time

    a + b·decodes + c·prefill tokens + d·context tokens     (wok_contracts.profile.StepProfile)

and each sequence that samples gets a token from a seeded generator. The KV pool is the
profile's capacity, as block bookkeeping only: no tensors, and no torch on this path at all.

The profile's time is the whole step period, host time included (a measured profile is fitted to
wall time per step, and the analytic one counts launch and host overhead in `a`). So a step that
continues sequences of the previous one is taken to begin when that one was due to end: the
engine's own work in between (outputs, metrics, scheduling) and a late wake-up from the sleep are
slept less, not added. A debt of more than a step is forgiven: a pod whose host work is longer
than its steps (or that the OS did not run for a while) is simply slower than its profile.

Tokens are never EOS nor another special token, so every output runs to `max_tokens` (or a stop
token or string): with vLLM's `ignore_eos: true` a trace's output lengths replay exactly. Text
prompts use builtin:tiny's tokenizer; token-id prompts are taken as they are.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from wok_contracts.profile import StepProfile, load_profile
from wok_runtime.core.builtin import SPECIAL_TOKENS, builtin_spec, ensure_builtin_tokenizer
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.step import StepTokens
from wok_runtime.core.tokenizer import Tokenizer

if TYPE_CHECKING:
    from wok_runtime.core.scheduler import SchedulerOutput
    from wok_runtime.core.sequence import Sequence

TOKENIZER_MODEL = "tiny"
# The BPE trainer numbers the special tokens first: every id from here on is plain text.
FIRST_PLAIN_TOKEN = len(SPECIAL_TOKENS)


class SimModelRunner:
    """A `StepExecutor` with the attributes the engine reads from a runner."""

    def __init__(
        self,
        profile: StepProfile,
        tokenizer: Tokenizer,
        *,
        config: ModelConfig,
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if config.vocab_size <= FIRST_PLAIN_TOKEN:
            raise ValueError(f"a vocabulary of {config.vocab_size} has no plain tokens")
        self.profile = profile
        self.tokenizer = tokenizer
        self.config = config  # vocab_size and eos_token_id, for the engine's validation
        self.model_name = f"sim:{profile.name}"
        self.num_blocks = profile.kv_blocks
        self.block_size = profile.block_size
        self.max_model_len = profile.max_model_len
        self.max_num_batched_tokens = profile.step_token_budget
        self._rng = random.Random(seed)  # unseeded requests share it: a run replays from `seed`
        self._clock = clock
        self._sleep = sleep
        self._last_ids: set[str] = set()  # the previous step's requests
        self._last_deadline = 0.0  # when the previous step was due to end

    @classmethod
    def from_profile(cls, ref: str, *, seed: int = 0) -> SimModelRunner:
        """`ref`: a builtin profile name (`sim:llama-3-8b-80g`) or a profile JSON path."""
        return cls(
            load_profile(ref),
            Tokenizer.from_dir(ensure_builtin_tokenizer(TOKENIZER_MODEL)),
            config=builtin_spec(TOKENIZER_MODEL).config,
            seed=seed,
        )

    def step_seconds(self, batch: SchedulerOutput) -> float:
        """The profile's time for this planned step. A sequence's context is every token its
        last scheduled token attends to: the cached ones and this step's."""
        context = sum(item.start_pos + item.num_tokens for item in batch.scheduled)
        return self.profile.step_seconds(batch.num_decode_tokens, batch.num_prefill_tokens, context)

    def execute(self, batch: SchedulerOutput) -> StepTokens:
        start = self._clock()
        seconds = self.step_seconds(batch)
        ids = {item.seq.request_id for item in batch.scheduled}
        # A request of the previous step still running means the engine never went idle since.
        continuing = not ids.isdisjoint(self._last_ids)
        behind = start - self._last_deadline
        began = self._last_deadline if continuing and behind < seconds else start
        deadline = began + seconds
        sampled = {item.seq: self._token(item.seq) for item in batch.scheduled if item.samples}
        remaining = deadline - self._clock()
        if remaining > 0:
            self._sleep(remaining)
        self._last_ids = ids
        self._last_deadline = deadline
        return StepTokens(sampled, {})

    def release(self, request_id: str) -> None:
        """Nothing to forget: a seeded request's tokens are a function of (seed, position)."""

    def _token(self, seq: Sequence) -> int:
        vocab = self.config.vocab_size
        if seq.params.seed is None:
            return self._rng.randrange(FIRST_PLAIN_TOKEN, vocab)
        # Its own stream, whatever shares the batch, and the same after a preemption.
        return random.Random(f"{seq.params.seed}:{seq.num_tokens}").randrange(
            FIRST_PLAIN_TOKEN, vocab
        )
