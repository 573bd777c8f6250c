"""`LLMEngine`: the step loop that ties the queue, the scheduler, the model runner and the sampler
together, in a thread of its own.

Why a thread with a lock: the HTTP server (asyncio) and the admin API submit, abort and retune from
other threads, while each model step takes milliseconds to seconds. All scheduler state is touched
only under one lock; the model forward runs outside it, so submissions never wait for a step.
Callbacks (`on_output`, `on_step`) are always called from the engine thread, outside the lock.

What runs a step is a `StepExecutor` (step.py): the PyTorch model runner with the sampler, or
the simulated accelerator. The engine itself never imports torch, so a simulated pod does not.

Robustness is per request: a bad request is refused at `add_request` (InvalidRequestError), a
row of non-finite logits fails only its request, and an exception in a whole step is retried per
sequence to find the culprit (sampled_step.py), so one request can never stop the loop. An
exception in post-processing fails that step's requests and the loop goes on; one anywhere else in
an iteration (housekeeping, scheduling, or the clean-up after a failed post-processing) leaves the
scheduler's state unknown, so the engine stops: every request in flight ends with "error" and the
message, new ones are refused (EngineDeadError), and `failure` says why (the server's /healthz
turns 503 on it, so the kubelet restarts the pod). Never a thread that dies and leaves callers
waiting.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wok_runtime.core.block_manager import BlockManager
from wok_runtime.core.engine_config import BatchingParams, EngineConfig, Mode
from wok_runtime.core.request_queue import QueueFullError, RequestQueue
from wok_runtime.core.sampling_params import SamplingParams
from wok_runtime.core.scheduler import Scheduler, SchedulerOutput
from wok_runtime.core.sequence import LANES, Lane, RequestMetrics, Sequence
from wok_runtime.core.step import StepExecutor, StepTokens

__all__ = [
    "BatchingParams",
    "EngineConfig",
    "EngineDeadError",
    "EngineStats",
    "InvalidRequestError",
    "LLMEngine",
    "QueueFullError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "StepStats",
]

log = logging.getLogger(__name__)


class InvalidRequestError(ValueError):
    """The request can never run (empty prompt, too long, bad token ids): refused, not queued."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an internal error (`LLMEngine.failure`): nothing more runs."""


@dataclass(frozen=True)
class RequestOutput:
    """What `on_output` receives. `new_token_ids` are the tokens since the previous output; the EOS
    or stop token that ends a request with finish_reason "stop" is not included (it is counted in
    `metrics.num_output_tokens`)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "timeout" | "error"
    error: str | None
    metrics: RequestMetrics


@dataclass(frozen=True)
class StepStats:
    """One engine step, for `on_step`. `batch_size` is the sequences in this step's forward;
    like `num_running` and `num_waiting` it counts both lanes."""

    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    step_seconds: float
    num_sampled: int  # sequences that produced a token this step
    num_running: int
    num_waiting: int
    max_batch_size: int  # the admission cap in effect
    kv_usage: float


@dataclass(frozen=True)
class EngineStats:
    """The engine now. The unprefixed request figures are the online lane's (what the vLLM
    metric names and the operator's autoscaling mean); `batch_*` are the batch lane's. The
    `kv_blocks_*` figures are the whole pool, while `kv_usage` counts only online blocks: the
    batch lane's are the online lane's to take back at any step."""

    num_waiting: int
    num_running: int
    waiting_by_priority: dict[int, int]
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_usage: float
    max_batch_size: int
    max_num_batched_tokens: int  # the step token budget in effect
    num_preemptions_total: int
    batch_waiting: int = 0
    batch_running: int = 0
    batch_kv_blocks: int = 0
    batch_preemptions_total: int = 0
    batch_pending_tokens: int = 0  # output tokens the batch lane still owes, at most
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found there (their prefill skipped)


OutputCallback = Callable[[RequestOutput], None]


class LLMEngine:
    """`runner` is either a `StepExecutor` (it picks its own tokens: the simulated accelerator) or
    a logits runner (`forward`, the PyTorch `ModelRunner`), which the engine pairs with the
    sampler. Either way it carries `tokenizer`, `config` (`vocab_size`, `eos_token_id`),
    `num_blocks`, `block_size`, `max_model_len` and `max_num_batched_tokens`."""

    def __init__(
        self,
        runner: Any,
        config: EngineConfig,
        *,
        on_step: Callable[[StepStats], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self._clock = clock  # monotonic seconds; tests pass a manual clock
        self.config = config
        self.tokenizer = runner.tokenizer
        self.model_name: str = getattr(runner, "model_name", None) or "wok"
        runner_max = _runner_max_model_len(runner)
        self.max_model_len = config.max_model_len or runner_max
        if self.max_model_len > runner_max:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's limit of {runner_max}"
            )
        # The runner sized its activations for a step budget; the engine never exceeds it, at
        # start or live.
        budget_limit = (
            getattr(runner, "max_num_batched_tokens", None) or config.max_num_batched_tokens
        )
        self.vocab_size: int = runner.config.vocab_size
        self.block_manager = BlockManager(
            runner.num_blocks,
            runner.block_size,
            tenant_kv_share=config.tenant_kv_share,
            prefix_caching=config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            mode=config.mode,
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            max_num_batched_tokens=min(config.max_num_batched_tokens, budget_limit),
            token_budget_limit=budget_limit,
            max_model_len=self.max_model_len,
            block_manager=self.block_manager,
            queue=RequestQueue(
                config.max_queue, aging_s=config.aging_s, timeout_s=config.queue_timeout_s
            ),
            batch_queue=RequestQueue(
                config.batch_max_queue,
                aging_s=config.aging_s,
                name="batch queue",
                timeout_s=config.batch_queue_timeout_s,
            ),
            batch_lane_max_batch_size=config.batch_lane_max_batch_size,
            eos_token_id=_eos_token_id(runner),
        )
        self._executor = _executor_for(runner)
        self.on_step = on_step  # public: the server attaches its metrics hook after building
        # Called after each batch of `on_output` calls (a step's, an abort's): a consumer that
        # buffers outputs hands them on here, once per batch rather than once per request.
        self.after_outputs: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._callbacks: dict[str, OutputCallback] = {}
        self._final_only: set[str] = set()  # requests whose caller wants no incremental outputs
        self._pending_aborts: list[str] = []
        self._accepting = True
        self._stop_deadline: float | None = None
        self._thread: threading.Thread | None = None
        self.loop_iterations = 0  # for the no-spin test
        # Why the loop stopped on an internal error (None while it runs): a restart is needed.
        self.failure: str | None = None

    # --- public API (thread-safe) -------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the engine is already started")
            self._thread = threading.Thread(target=self._loop, name="wok-engine", daemon=True)
            self._thread.start()

    def shutdown(self, drain_timeout_s: float) -> None:
        """Refuses new requests, lets queued and running ones finish for up to
        `drain_timeout_s`, aborts what is left, and stops the engine thread."""
        with self._wake:
            self._accepting = False
            self.scheduler.draining = True
            self._stop_deadline = self._clock() + max(0.0, drain_timeout_s)
            thread = self._thread
            self._wake.notify_all()
        if thread is None:
            self._abort_all_unstarted()
            return
        if thread is not threading.current_thread():  # from a callback: the loop ends by itself
            thread.join()

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        on_output: OutputCallback,
        priority: int = 1,
        tenant: str | None = None,
        queue_timeout_s: float | None = None,
        request_id: str | None = None,
        incremental: bool = True,
        lane: Lane = "online",
    ) -> str:
        """`on_output` gets each step's new tokens, or with `incremental=False` one output when
        the request has finished (a non-streamed answer: one wake-up instead of one a token).
        `lane="batch"`: offline work, served from what the online lane leaves free (its own
        queue and queue timeout)."""
        self._validate(prompt_token_ids, params)
        if lane not in LANES:
            raise InvalidRequestError(f"lane must be one of {', '.join(LANES)}, got {lane!r}")
        timeout = self.config.queue_timeout_s
        if lane == "batch":
            timeout = self.config.batch_queue_timeout_s
        if queue_timeout_s is not None:
            if not queue_timeout_s > 0:
                raise InvalidRequestError(f"queue_timeout_s must be > 0, got {queue_timeout_s}")
            timeout = min(queue_timeout_s, timeout)  # a request may only shorten its wait
        request_id = request_id or uuid.uuid4().hex
        with self._wake:
            now = self._clock()
            if self.failure is not None:
                raise EngineDeadError(self.failure)
            if not self._accepting:
                raise QueueFullError("the engine is shutting down", self.config.queue_timeout_s)
            if request_id in self._callbacks:
                raise InvalidRequestError(f"request id {request_id!r} is already in use")
            seq = Sequence(
                request_id=request_id,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                arrival_time=now,
                priority=priority,
                tenant=tenant,
                lane=lane,
                queue_deadline=now + timeout,
            )
            self.scheduler.add(seq, now)  # raises QueueFullError
            self._callbacks[request_id] = on_output
            if not incremental:
                self._final_only.add(request_id)
            self._wake.notify()
        return request_id

    def abort(self, request_id: str) -> None:
        """Ends the request at the top of the next step (a no-op for unknown or done requests)."""
        with self._wake:
            self._pending_aborts.append(request_id)
            self._wake.notify()

    def retry_after_s(self, lane: Lane = "online") -> float:
        """When a refused request of `lane` should try again: its queue's drain estimate."""
        with self._lock:
            sched = self.scheduler
            queue = sched.batch_queue if lane == "batch" else sched.queue
            return queue.retry_after_s(self._clock())

    def get_batching(self) -> BatchingParams:
        with self._lock:
            return self._batching()

    def set_batching(
        self,
        *,
        max_batch_size: int | None = None,
        max_wait_ms: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> BatchingParams:
        """Changes the live parameters (from the next step on); returns them as clamped."""
        with self._wake:
            self.scheduler.set_batching(
                max_batch_size=max_batch_size,
                max_wait_ms=max_wait_ms,
                max_num_batched_tokens=max_num_batched_tokens,
            )
            self._wake.notify()
            return self._batching()

    def stats(self) -> EngineStats:
        with self._lock:
            bm = self.block_manager
            sched = self.scheduler
            queue = sched.queue
            batch_running = [s for s in sched.running if s.is_batch]
            # The blocks only batch sequences hold: the prefix cache may share a block with an
            # online sequence, and then it is online (the batch lane cannot give it back).
            held = Counter(b for s in batch_running for b in s.block_table)
            batch_blocks = sum(bm.holders(block) == n for block, n in held.items())
            pending = [*batch_running, *sched.batch_queue.in_order(0.0)]
            return EngineStats(
                num_waiting=len(queue),
                num_running=len(sched.running) - len(batch_running),
                waiting_by_priority=queue.count_by_priority(),
                kv_blocks_total=bm.num_blocks,
                kv_blocks_used=bm.num_used_blocks,
                kv_blocks_free=bm.num_free_blocks,
                kv_usage=(bm.num_used_blocks - batch_blocks) / bm.num_blocks,
                max_batch_size=sched.max_batch_size,
                max_num_batched_tokens=sched.max_num_batched_tokens,
                num_preemptions_total=sched.preemptions["online"],
                batch_waiting=len(sched.batch_queue),
                batch_running=len(batch_running),
                batch_kv_blocks=batch_blocks,
                batch_preemptions_total=sched.preemptions["batch"],
                batch_pending_tokens=sum(
                    s.params.max_tokens - s.num_output_tokens for s in pending
                ),
                prefix_cache_queries=bm.prefix_queries,
                prefix_cache_hits=bm.prefix_hits,
            )

    @property
    def mode(self) -> Mode:
        return self.config.mode

    @property
    def max_num_batched_tokens(self) -> int:
        """The step token budget in effect (live: `set_batching`)."""
        return self.scheduler.max_num_batched_tokens

    # --- internals ----------------------------------------------------------------------------

    def _batching(self) -> BatchingParams:
        return BatchingParams(
            max_batch_size=self.scheduler.max_batch_size,
            max_wait_ms=self.scheduler.max_wait_ms,
            max_num_batched_tokens=self.scheduler.max_num_batched_tokens,
            mode=self.config.mode,
            capacity=self.scheduler.capacity,
            kv_safe_batch_size=self.scheduler.kv_safe_batch_size,
            batch_lane_max_batch_size=self.scheduler.batch_lane_max_batch_size,
            max_num_batched_tokens_limit=self.scheduler.token_budget_limit,
        )

    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams")
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int)]
        bad += [t for t in prompt if isinstance(t, int) and not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids must be integers in [0, {self.vocab_size}), got {bad[0]!r}"
            )
        if len(prompt) + params.max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"this model's maximum context length is {self.max_model_len} tokens, but "
                f"{len(prompt) + params.max_tokens} were requested ({len(prompt)} in the prompt, "
                f"{params.max_tokens} for the output)"
            )

    def _abort_all_unstarted(self) -> None:
        with self._lock:
            outputs = self._finish_everything(self._clock())
        self._emit(outputs)

    def step(self) -> bool:
        """One iteration of the loop, synchronously, for tests and offline drivers that do not
        `start()` the thread. Returns True when a model step ran."""
        if self._thread is not None:
            raise RuntimeError("step() drives an engine whose thread is not started")
        if self.failure is not None:
            return False
        ran, _ = self._guarded_iteration(block=False)
        return ran

    def _loop(self) -> None:
        done = False
        while not done:
            _, done = self._guarded_iteration(block=True)

    def _guarded_iteration(self, *, block: bool) -> tuple[bool, bool]:
        try:
            return self._iteration(block=block)
        except Exception as error:
            log.exception("the engine loop cannot continue")
            self._fail(f"the engine stopped on an internal error: {error!r}")
            return False, True

    def _fail(self, message: str) -> None:
        """Ends every request in flight with "error" and `message` and refuses new ones. Frees
        what it can, but trusts the scheduler's state no further than that."""
        with self._lock:
            self.failure = message
            self._accepting = False
            callbacks, self._callbacks = self._callbacks, {}
            self._final_only.clear()
            now = self._clock()
            outputs = [
                (
                    callback,
                    RequestOutput(
                        request_id=request_id,
                        new_token_ids=[],
                        finished=True,
                        finish_reason="error",
                        error=message,
                        metrics=self._release_failed(request_id, message, now),
                    ),
                )
                for request_id, callback in callbacks.items()
            ]
        self._emit(outputs)

    def _release_failed(self, request_id: str, message: str, now: float) -> RequestMetrics:
        """Best effort on a broken scheduler: frees the request's blocks, returns its metrics."""
        with contextlib.suppress(Exception):
            seq = self.scheduler.get(request_id)
            if seq is not None:
                self.scheduler.finish(seq, "error", now, error=message)
                return seq.metrics()
        return RequestMetrics(now, None, None, None, now, 0, 0, 0)

    def _iteration(self, *, block: bool) -> tuple[bool, bool]:
        """Housekeeping, scheduling and (outside the lock) one model step. Returns (ran a step,
        the engine is done). An idle engine waits on the condition instead of spinning."""
        with self._wake:
            self.loop_iterations += 1
            now = self._clock()
            outputs = self._housekeeping(now)
            stop_at = self._stop_deadline
            if stop_at is not None and (not self.scheduler.has_work() or now >= stop_at):
                outputs += self._finish_everything(now)
                batch = None
            else:
                batch = self.scheduler.schedule(now)
                if block and batch.is_empty and not batch.preempted and not outputs:
                    self._wake.wait(self._idle_timeout(now))
                    return False, False
        self._emit(outputs)
        if batch is None:
            return False, True
        if batch.is_empty:
            return False, False
        self._run_step(batch, now)
        return True, False

    def _idle_timeout(self, now: float) -> float | None:
        wakeups = [self.scheduler.next_wakeup(now), self._stop_deadline]
        due = min((t for t in wakeups if t is not None), default=None)
        return None if due is None else max(0.0, due - now)

    def _housekeeping(self, now: float) -> list[tuple[OutputCallback, RequestOutput]]:
        """Aborts and queue timeouts, at the top of a step (under the lock)."""
        outputs: list[tuple[OutputCallback, RequestOutput]] = []
        aborts, self._pending_aborts = self._pending_aborts, []
        for request_id in aborts:
            seq = self.scheduler.get(request_id)
            if seq is not None and not seq.is_finished:
                self.scheduler.finish(seq, "abort", now)
                outputs += self._outputs_for([seq])
        outputs += self._outputs_for(self.scheduler.expire(now))
        return outputs

    def _finish_everything(self, now: float) -> list[tuple[OutputCallback, RequestOutput]]:
        left = list(self.scheduler.running) + self.scheduler.waiting(now)
        for seq in left:
            self.scheduler.finish(seq, "abort", now, error="the engine shut down first")
        return self._outputs_for(left)

    def _run_step(self, batch: SchedulerOutput, now: float) -> None:
        started = time.perf_counter()
        try:
            result = self._executor.execute(batch)
        except Exception as error:  # an executor bug fails this step's requests, not the loop
            log.exception("a step of %d sequences failed", len(batch.scheduled))
            failure = f"the model step failed: {error!r}"
            result = StepTokens({}, {item.seq: failure for item in batch.scheduled})
        failed, sampled = result.failed, result.sampled
        with self._lock:
            done_at = self._clock()
            try:
                for seq, reason in failed.items():
                    self.scheduler.finish(seq, "error", done_at, error=reason)
                advanced = self.scheduler.postprocess(batch, sampled, done_at)
            except Exception as error:  # fails this step's requests; the loop goes on
                log.exception("post-processing a step of %d sequences failed", len(batch.scheduled))
                failure = f"the engine failed to post-process a step: {error!r}"
                failed = {item.seq: failure for item in batch.scheduled}
                for seq in failed:  # raises on a broken scheduler: the loop stops (_fail)
                    self.scheduler.finish(seq, "error", done_at, error=failure)
                advanced = []
            touched = list(dict.fromkeys([*advanced, *failed]))
            outputs = self._outputs_for(touched)
            stats = StepStats(
                batch_size=len(batch.scheduled),
                num_prefill_tokens=batch.num_prefill_tokens,
                num_decode_tokens=batch.num_decode_tokens,
                num_preempted=len(batch.preempted),
                step_seconds=time.perf_counter() - started,
                num_sampled=len(sampled),
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.queue) + len(self.scheduler.batch_queue),
                max_batch_size=self.scheduler.max_batch_size,
                kv_usage=self.block_manager.usage,
            )
        self._emit(outputs)
        if self.on_step is not None:
            try:
                self.on_step(stats)
            except Exception:
                log.exception("on_step callback failed")

    def _outputs_for(self, seqs: list[Sequence]) -> list[tuple[OutputCallback, RequestOutput]]:
        """Incremental outputs (under the lock); finished requests drop their callback."""
        outputs: list[tuple[OutputCallback, RequestOutput]] = []
        for seq in seqs:
            callback = self._callbacks.get(seq.request_id)
            if callback is None:
                continue
            if not seq.is_finished and seq.request_id in self._final_only:
                continue
            visible = seq.output_token_ids
            if seq.finish_reason == "stop":
                visible = visible[:-1]  # the EOS / stop token itself is not text
            new = visible[seq.num_emitted_tokens :]
            if not seq.is_finished:
                # The first token goes at once (TTFT); later ones in chunks of stream_interval.
                held = seq.num_emitted_tokens > 0 and len(new) < self.config.stream_interval
                if not new or held:
                    continue
            seq.num_emitted_tokens = len(visible)
            if seq.is_finished:
                del self._callbacks[seq.request_id]
                self._final_only.discard(seq.request_id)
                self._executor.release(seq.request_id)
            outputs.append(
                (
                    callback,
                    RequestOutput(
                        request_id=seq.request_id,
                        new_token_ids=new,
                        finished=seq.is_finished,
                        finish_reason=seq.finish_reason,
                        error=seq.error,
                        metrics=seq.metrics(),
                    ),
                )
            )
        return outputs

    def _emit(self, outputs: list[tuple[OutputCallback, RequestOutput]]) -> None:
        for callback, output in outputs:
            try:
                callback(output)
            except Exception:
                log.exception("on_output callback failed for %s", output.request_id)
        if outputs and self.after_outputs is not None:
            try:
                self.after_outputs()
            except Exception:
                log.exception("after_outputs callback failed")


def _executor_for(runner: Any) -> StepExecutor:
    if isinstance(runner, StepExecutor):
        return runner
    from wok_runtime.core.sampled_step import SampledStep  # torch: only for a logits runner

    return SampledStep(runner)


def _runner_max_model_len(runner: Any) -> int:
    value = getattr(runner, "max_model_len", None)
    return int(value) if value else int(runner.config.max_position)


def _eos_token_id(runner: Any) -> int | None:
    for name in ("eos_token_id", "eos"):
        value = getattr(runner.config, name, None)
        if value is not None:
            return int(value[0] if isinstance(value, list | tuple) else value)
    return None
