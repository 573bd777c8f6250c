"""Iteration-level (continuous) batching: which sequences run in the next model step, and how many
tokens each.

Every step the running sequences go first (decodes before prefill chunks, best priority first),
then waiting requests are admitted while the running count is under the admission cap
(`max_batch_size`), the step's token budget (`max_num_batched_tokens`) lasts and KV blocks are
free. A prompt longer than what is left of the budget is prefilled in chunks over several steps.
When blocks run out, the lowest-priority, newest running sequence is preempted by recompute: its
blocks are freed and it goes back to the queue with its generated tokens, which are recomputed as
prompt when it is admitted again; nothing is lost. A waiting request starts after its longest
cached prefix (block_manager.py): its first chunk is only the tokens the cache does not hold.

The cap is live (`set_batching`): lowering it stops admissions until the running count drains
below it (no preemption); raising it is clamped to `capacity` = the number of KV blocks (each
running sequence holds at least one). Up to `kv_safe_batch_size` (how many `max_model_len`
sequences the pool holds) preemption cannot happen; above it the pool is overcommitted and
preemption absorbs the overflow. The token budget is live too: a new budget bounds the next
step's chunks (a prompt part-way through its prefill goes on in chunks of the new size; nothing
is dropped or reordered), clamped to [1, `token_budget_limit`], the most the model runner sized
its activations for. Two baseline modes share the interface: `static` admits a whole
batch only when nothing runs (when `max_batch_size` requests wait or the oldest has waited
`max_wait_ms`) and runs it to completion; `serial` runs one request at a time.

Two lanes. The online lane is scheduled as if the batch lane did not exist: its running sequences
go first, then its waiting requests are admitted under `max_batch_size`, and a running batch
sequence counts as room the online lane may take back (preempted by recompute, the one that
loses least work first, only as many as the online request in hand needs: a slot under the cap,
or KV blocks). The batch lane then gets what is left: its running sequences run on the leftover
token budget, and its waiting requests are admitted only while no online request waits and no
sequence was preempted this step, into the slots below `max_batch_size` that online sequences do
not use, less one kept free for the next online arrival, and leaving one free block per running
online sequence (their next decode growth would otherwise evict batch work at once). When the
online lane has been idle (nothing running or waiting) for `online_idle_grace_s`, it may grow to
`batch_lane_max_batch_size`; the grace keeps a trickle of online arrivals from shrinking and
regrowing a large batch every step. Online sequences are never preempted for batch ones. In the
baseline modes (static, serial), which never preempt, batch work is admitted only when nothing
runs.

Pure Python: no torch, times are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wok_runtime.core.block_manager import BlockManager
from wok_runtime.core.engine_config import Mode
from wok_runtime.core.request_queue import RequestQueue
from wok_runtime.core.sequence import Lane, Sequence, SequenceStatus

#: How long the online lane must have been idle before the batch lane may exceed
#: `max_batch_size`: long enough that sparse online arrivals do not shrink a large batch lane
#: (by preemption) and regrow it (by recompute) over and over.
ONLINE_IDLE_GRACE_S = 1.0
#: Slots under `max_batch_size` the batch lane leaves free while online traffic is about, for
#: the next online arrival: without one, every arrival finds the cap full and preempts a batch
#: sequence whose prompt is then computed again (`bench/runtime/results/batch_lane.md`).
ONLINE_HEADROOM_SLOTS = 1


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    start_pos: int  # position of the first token run this step
    num_tokens: int  # tokens run this step: a prefill chunk, or 1 for a decode

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start_pos : self.start_pos + self.num_tokens]

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last token, so a new token is sampled."""
        return self.start_pos + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def _rank(seq: Sequence) -> tuple[bool, int, float]:
    """Lower is better: the online lane before the batch lane, then the priority class, then
    arrival (older first)."""
    return (seq.is_batch, seq.priority, seq.arrival_time)


def _recompute_cost(seq: Sequence) -> tuple[int, float]:
    """Lower is cheaper to preempt: the work a recompute repeats, then the newer arrival."""
    return (seq.num_computed_tokens, -seq.arrival_time)


class Scheduler:
    def __init__(
        self,
        *,
        mode: Mode,
        max_batch_size: int,
        max_wait_ms: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        block_manager: BlockManager,
        queue: RequestQueue,
        eos_token_id: int | None,
        batch_queue: RequestQueue | None = None,
        batch_lane_max_batch_size: int | None = None,
        online_idle_grace_s: float = ONLINE_IDLE_GRACE_S,
        token_budget_limit: int | None = None,
    ) -> None:
        self.mode = mode
        # The ceiling of the live budget (None: the budget at start).
        self.token_budget_limit = token_budget_limit or max_num_batched_tokens
        if not 1 <= max_num_batched_tokens <= self.token_budget_limit:
            raise ValueError(
                f"max_num_batched_tokens must be in [1, {self.token_budget_limit}], "
                f"got {max_num_batched_tokens}"
            )
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_manager = block_manager
        self.queue = queue  # the online lane's
        if batch_queue is None:  # (not `or`: an empty queue is falsy)
            batch_queue = RequestQueue(1024, queue.aging_s, name="batch queue")
        self.batch_queue = batch_queue
        self.online_idle_grace_s = online_idle_grace_s
        self._online_seen_at = -math.inf  # the last step that had online work
        self.eos_token_id = eos_token_id
        blocks_per_seq = block_manager.blocks_for_tokens(max_model_len)
        if blocks_per_seq > block_manager.num_blocks:
            raise ValueError(
                f"the KV pool ({block_manager.num_blocks} blocks of {block_manager.block_size} "
                f"tokens) cannot hold one sequence of max_model_len={max_model_len} tokens"
            )
        if blocks_per_seq > block_manager.tenant_quota_blocks:
            raise ValueError(
                f"tenant_kv_share={block_manager.tenant_kv_share} leaves a tenant "
                f"{block_manager.tenant_quota_blocks} KV blocks, fewer than one sequence of "
                f"max_model_len={max_model_len} tokens needs ({blocks_per_seq})"
            )
        # Each running sequence holds at least one block, so no more than num_blocks can run.
        # Above kv_safe_batch_size (full-length sequences that fit) the pool is overcommitted,
        # as in vLLM: fine while sequences are shorter than max_model_len, and preemption by
        # recompute absorbs the rest. The operator's memory cap (B_mem) sits on top of this.
        self.capacity = block_manager.num_blocks
        self.kv_safe_batch_size = max(1, block_manager.num_blocks // blocks_per_seq)
        self.running: list[Sequence] = []
        self.max_batch_size = 1
        self.max_wait_ms = 0
        self.draining = False  # static mode: form a batch at once instead of waiting to fill
        self.preemptions: dict[Lane, int] = {"online": 0, "batch": 0}
        # Default: the memory cap, as many max_model_len sequences as the pool holds, so a
        # large batch lane never has to preempt itself.
        self.batch_lane_max_batch_size = self.kv_safe_batch_size
        self.set_batching(
            max_batch_size=max_batch_size,
            max_wait_ms=max_wait_ms,
            batch_lane_max_batch_size=batch_lane_max_batch_size,
        )

    # --- live parameters ----------------------------------------------------------------------

    def set_batching(
        self,
        *,
        max_batch_size: int | None = None,
        max_wait_ms: int | None = None,
        batch_lane_max_batch_size: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> None:
        """Takes effect at the next `schedule`. Values are clamped, never refused."""
        if max_num_batched_tokens is not None:
            self.max_num_batched_tokens = min(
                max(1, max_num_batched_tokens), self.token_budget_limit
            )
        if max_batch_size is not None:
            self.max_batch_size = (
                1 if self.mode == "serial" else min(max(1, max_batch_size), self.capacity)
            )
        if max_wait_ms is not None:
            self.max_wait_ms = max(0, max_wait_ms)
        if batch_lane_max_batch_size is not None:
            self.batch_lane_max_batch_size = min(max(1, batch_lane_max_batch_size), self.capacity)

    @property
    def num_preemptions_total(self) -> int:
        return sum(self.preemptions.values())

    # --- requests in and out ------------------------------------------------------------------

    def queue_of(self, seq: Sequence) -> RequestQueue:
        return self.batch_queue if seq.is_batch else self.queue

    def add(self, seq: Sequence, now: float) -> None:
        """Queues `seq` in its lane's queue; QueueFullError when that queue is at its bound (a
        full batch queue never refuses online work, nor the reverse)."""
        self.queue_of(seq).push(seq, now)

    def has_work(self) -> bool:
        return bool(self.running) or len(self.queue) > 0 or len(self.batch_queue) > 0

    def get(self, request_id: str) -> Sequence | None:
        seq = self.queue.get(request_id) or self.batch_queue.get(request_id)
        if seq is not None:
            return seq
        return next((s for s in self.running if s.request_id == request_id), None)

    def waiting(self, now: float) -> list[Sequence]:
        """Every waiting request, the online lane's first, each lane in service order."""
        return [*self.queue.in_order(now), *self.batch_queue.in_order(now)]

    def finish(self, seq: Sequence, reason: str, now: float, error: str | None = None) -> None:
        """Ends a request wherever it is (queue or running) and frees everything it holds."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.WAITING:
            self.queue_of(seq).remove(seq.request_id)
        elif seq in self.running:
            self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.error = error
        seq.finished_time = now
        if seq.first_scheduled_time is not None:
            self.queue_of(seq).completions.record(now)  # each lane's Retry-After is its own

    def expire(self, now: float) -> list[Sequence]:
        """Waiting requests past their queue deadline, finished with reason "timeout"."""
        expired = self.queue.expire(now) + self.batch_queue.expire(now)
        for seq in expired:
            waited = now - seq.arrival_time
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = "timeout"
            seq.error = f"waited {waited:.2f} s in the queue without being scheduled"
            seq.finished_time = now
        return expired

    def next_wakeup(self, now: float) -> float | None:
        """When an idle engine must look again even if nothing arrives (a queue deadline, the
        moment a static batch is due, or the end of the online idle grace, which may open the
        batch lane's slots: with `max_batch_size` 1 the headroom leaves it none before)."""
        deadlines = (self.queue.next_deadline(), self.batch_queue.next_deadline())
        times = [t for t in deadlines if t is not None]
        grace_end = self._online_seen_at + self.online_idle_grace_s
        if len(self.batch_queue) > 0 and grace_end > now:
            times.append(grace_end)
        if self.mode == "static" and not self.running:
            oldest = self.queue.oldest_arrival()
            if oldest is not None:
                times.append(oldest + self.max_wait_ms / 1000.0)
        return min(times, default=None)

    # --- one step -----------------------------------------------------------------------------

    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        chosen: dict[Sequence, int] = {}  # seq -> tokens this step, in insertion order
        if self._online_present():
            self._online_seen_at = now
        online = [s for s in self.running if not s.is_batch]
        budget = self._run(online, self.max_num_batched_tokens, chosen, out)
        # After an online preemption the pool is short: admitting would only evict again (and
        # could readmit the victim in the same step).
        if not any(not s.is_batch for s in out.preempted):
            budget = self._admit_online(now, budget, chosen, out)
        batch = [s for s in self.running if s.is_batch]  # those the online lane left running
        budget = self._run(batch, budget, chosen, out)
        if not out.preempted and len(self.queue) == 0:
            budget = self._admit_batch(now, budget, chosen)
        for seq, n in chosen.items():
            item = ScheduledSeq(seq=seq, start_pos=seq.num_computed_tokens, num_tokens=n)
            out.scheduled.append(item)
            if seq.num_uncomputed_tokens == 1 and seq.num_output_tokens > 0:
                out.num_decode_tokens += n
            else:
                out.num_prefill_tokens += n
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
        assert budget >= 0
        return out

    def _run(
        self, seqs: list[Sequence], budget: int, chosen: dict[Sequence, int], out: SchedulerOutput
    ) -> int:
        """Schedules running sequences (of one lane) on `budget`, preempting worse-ranked ones
        when blocks run out; returns the budget left."""
        ranked = sorted(seqs, key=_rank)
        # Decodes first: one token each keeps every running sequence moving even when a long
        # prefill chunk would eat the whole budget.
        order = [s for s in ranked if s.num_uncomputed_tokens == 1]
        order += [s for s in ranked if s.num_uncomputed_tokens > 1]
        for seq in order:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_uncomputed_tokens, budget)
            if n == 0:
                continue
            while not self.block_manager.can_allocate(seq, seq.num_computed_tokens + n):
                victim = self._pick_victim(seq, seq.num_computed_tokens + n)
                if victim is None:
                    self._preempt(seq, out)
                    break
                budget += chosen.pop(victim, 0)
                self._preempt(victim, out)
            else:
                self.block_manager.allocate(seq, seq.num_computed_tokens + n)
                chosen[seq] = n
                budget -= n
        return budget

    def _online_present(self) -> bool:
        return len(self.queue) > 0 or any(not s.is_batch for s in self.running)

    def _admission_cap(self, now: float) -> int:
        """How many sequences may be running after this step's admissions."""
        if self.mode == "serial":
            return 1 if not self.running else 0
        if self.mode == "static":
            if self.running or len(self.queue) == 0:
                return 0  # a static batch runs to completion before the next forms
            oldest = self.queue.oldest_arrival()
            assert oldest is not None
            due = (
                self.draining
                or len(self.queue) >= self.max_batch_size
                or (now - oldest) * 1000.0 >= self.max_wait_ms
            )
            return self.max_batch_size if due else 0
        return self.max_batch_size

    def _batch_cap(self, now: float) -> int:
        """How many sequences (both lanes) may be running after this step's batch admissions."""
        if self.mode != "continuous":
            # The baseline modes never preempt, so batch work starts only on an idle engine.
            return 0 if self.running else (1 if self.mode == "serial" else self.max_batch_size)
        idle = not self._online_present() and now - self._online_seen_at >= self.online_idle_grace_s
        if idle:
            return self.batch_lane_max_batch_size
        return self.max_batch_size - ONLINE_HEADROOM_SLOTS

    def _admit_online(
        self, now: float, budget: int, chosen: dict[Sequence, int], out: SchedulerOutput
    ) -> int:
        cap = self._admission_cap(now)
        # Continuous mode takes slots and blocks back from the batch lane; the baseline modes
        # never preempt.
        reclaim = self.mode == "continuous"
        admitted: list[Sequence] = []
        blocked: set[str] = set()  # tenants at their share: their later requests wait too
        for seq in self.queue.in_order(now):
            if budget == 0:
                break
            end, n = self._first_chunk(seq, budget)
            if self._tenant_waits(seq, end, blocked):
                continue  # other tenants may still be admitted, in order
            batch = [s for s in self.running if s.is_batch] if reclaim else []
            slots = len(self.running) + len(admitted) + 1 - cap  # to free for this one
            batch_blocks = sum(len(s.block_table) for s in batch)
            need = self.block_manager.blocks_needed(seq, end)
            if slots > len(batch) or need > self.block_manager.num_free_blocks + batch_blocks:
                break  # full even without the batch lane: keep priority order, let no small one by
            # Only what this request needs: a slot under the cap, then blocks.
            for _ in range(max(0, slots)):
                self._evict_batch(out)
            while not self.block_manager.can_allocate(seq, end) and self._evict_batch(out):
                pass
            if not self.block_manager.can_allocate(seq, end):
                break
            self._start(seq, end, n, chosen, admitted)
            budget -= n
        self._move_to_running(self.queue, admitted)
        return budget

    def _admit_batch(self, now: float, budget: int, chosen: dict[Sequence, int]) -> int:
        cap = self._batch_cap(now)
        running_batch = sum(s.is_batch for s in self.running)
        # Growth room for the online sequences' next blocks, so that a decode does not evict
        # the batch sequence just admitted (recompute churn).
        reserve = sum(not s.is_batch for s in self.running)
        admitted: list[Sequence] = []
        blocked: set[str] = set()
        for seq in self.batch_queue.in_order(now):
            full = len(self.running) + len(admitted) >= cap
            if full or running_batch + len(admitted) >= self.batch_lane_max_batch_size:
                break
            if budget == 0:
                break
            end, n = self._first_chunk(seq, budget)
            if self._tenant_waits(seq, end, blocked):
                continue
            need = self.block_manager.blocks_needed(seq, end)
            if not self.block_manager.can_allocate(seq, end):
                break
            if self.block_manager.num_free_blocks - need < reserve:
                break
            self._start(seq, end, n, chosen, admitted)
            budget -= n
        self._move_to_running(self.batch_queue, admitted)
        return budget

    def _first_chunk(self, seq: Sequence, budget: int) -> tuple[int, int]:
        """(end, n) of a waiting sequence's first step: the `n` tokens after its cached prefix,
        up to position `end`."""
        cached = self.block_manager.num_cached_tokens(seq)
        n = min(seq.num_tokens - cached, budget)
        return cached + n, n

    def _tenant_waits(self, seq: Sequence, end: int, blocked: set[str]) -> bool:
        """True when `seq` must wait for its tenant: the tenant is at its share, or one of its
        earlier requests was (admission keeps each tenant's order: a smaller request never
        passes one of its own tenant that does not fit). With one tenant, that is strict
        arrival order, as `wok_sim.replica` keeps it."""
        tenant = seq.tenant or ""
        if tenant not in blocked and self.block_manager.tenant_blocked(seq, end):
            blocked.add(tenant)
        return tenant in blocked

    def _start(
        self,
        seq: Sequence,
        end: int,
        n: int,
        chosen: dict[Sequence, int],
        admitted: list[Sequence],
    ) -> None:
        self.block_manager.allocate(seq, end)  # also moves num_computed_tokens past the cache
        assert seq.num_computed_tokens + n == end
        admitted.append(seq)
        chosen[seq] = n

    def _move_to_running(self, queue: RequestQueue, admitted: list[Sequence]) -> None:
        for seq in admitted:
            queue.remove(seq.request_id)
            seq.status = SequenceStatus.RUNNING
            seq.queue_deadline = None  # admitted once: a later preemption never times it out
            self.running.append(seq)

    def _evict_batch(self, out: SchedulerOutput) -> bool:
        """Preempts the running batch sequence that loses least work; False when none runs.
        Called before the batch lane is scheduled, so no step budget is held by a victim."""
        batch = [s for s in self.running if s.is_batch]
        if not batch:
            return False
        self._preempt(min(batch, key=_recompute_cost), out)
        return True

    def _pick_victim(self, needy: Sequence, num_tokens: int) -> Sequence | None:
        """A running sequence ranked below `needy`: a batch one if any (the cheapest to
        recompute), else the worst-ranked; when `needy`'s tenant is at its quota, only that
        tenant's own sequences qualify (a tenant never evicts another)."""
        tenant_bound = self.block_manager.tenant_blocked(needy, num_tokens)
        candidates = [
            s
            for s in self.running
            if s is not needy
            and _rank(s) > _rank(needy)
            and (not tenant_bound or (s.tenant or "") == (needy.tenant or ""))
        ]
        batch = [s for s in candidates if s.is_batch]
        if batch:  # batch work goes first, the sequence whose recompute costs least
            return min(batch, key=_recompute_cost)
        return max(candidates, key=_rank, default=None)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        if seq.block_table or seq.num_computed_tokens:
            seq.num_preemptions += 1
            self.preemptions[seq.lane] += 1
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        self.queue_of(seq).requeue(seq)
        out.preempted.append(seq)

    def postprocess(
        self, output: SchedulerOutput, sampled: dict[Sequence, int], now: float
    ) -> list[Sequence]:
        """Advances the scheduled sequences by their step, appends sampled tokens and finishes
        those that stopped. Sequences missing from `sampled` although they should have sampled
        must have been finished by the caller (an error). Returns the sequences that got a token."""
        advanced: list[Sequence] = []
        for item in output.scheduled:
            seq = item.seq
            if seq.is_finished:
                continue
            seq.num_computed_tokens += item.num_tokens
            self.block_manager.cache_computed(seq, item.start_pos)
            if not item.samples:
                continue
            token = sampled[seq]
            seq.append_token(token, now)
            advanced.append(seq)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason, now)
        return advanced

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token == self.eos_token_id and not seq.params.ignore_eos:
            return "stop"
        if token in seq.params.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None
