"""One runtime pod, iteration by iteration, with the runtime scheduler's semantics and none of its
tensors: the fleet simulator runs dozens of these for an hour of trace in seconds.

The semantics are `wok_runtime.core.scheduler`'s (see its docstring): every step the running
sequences go first (decodes, then prefill chunks, oldest first), then waiting requests are admitted
in arrival order while the running count is under the batch cap B, the step's token budget lasts and
KV blocks are free. Prompts are prefilled in chunks. The cap and the budget are live
(`set_batch_cap`, `set_token_budget`), as the runtime's admin API sets them. KV is held in blocks;
when a sequence cannot grow, the newest running one is preempted by recompute (blocks freed, back to
the queue, its prompt and generated tokens recomputed as prompt). The queue is bounded (a request
beyond it is rejected: HTTP 429) and a request never admitted within the queue timeout ends as a
timeout. Queue timeouts are checked at the top of each step, as the engine does. `static` mode
admits a whole batch only when nothing runs and B requests wait or the oldest waited `max_wait_ms`,
and runs it to completion. A step costs what the profile says.

Automatic prefix caching, from a trace's `hash_ids` (Mooncake's 512-token blocks): a request
admitted starts after the longest run of its leading blocks that the replica's cache holds, as
the runtime's block manager does (whole blocks, the last token always computed), so its prefill,
and the step time the profile charges for it, count only the rest; the attention over the cached
context is still paid. A prompt's blocks enter the cache when its prefill completes. The cache
holds as many blocks as the KV pool and forgets the least recently used; the blocks a hit shares
are still counted once per sequence in the pool (the memory side is conservative).

Why it is fast: most steps decode only. While no prefill is pending and nothing can be admitted,
every running sequence gains one token per step, so a stretch of k steps with n sequences costs
k·α + d·n·k(k−1)/2 (α = a + b·n + d·(C + n), C = Σ context) and the replica jumps straight to the
next event: the next finish (a heap of finish step numbers against a per-replica step counter),
the caller's next time (an arrival, a scrape, a control tick), a queue deadline, or the step where
the KV pool would overflow (from the counts of sequences per block-boundary residue). Decoding
sequences are kept lazily (their context is `base + step counter`), so a jump is O(block size +
log n). Steps with prefill or admissions run one at a time, the decoding sequences still lazy (each
takes one token of the budget and its new blocks come from the residue counts), so such a step
costs O(prefilling + admitted); a step that may preempt runs the exact path. `fast=False` (the
`step` engine) runs every step exactly, the reference that tests/unit/test_sim_engines.py holds
the fast path to.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass
from operator import attrgetter
from typing import Literal

from wok_contracts.profile import StepProfile
from wok_contracts.traces import HASH_BLOCK_TOKENS, TraceRequest, clip_to_model

Outcome = Literal["ok", "rejected", "timeout", "dropped"]
Mode = Literal["continuous", "static"]
DEFAULT_MAX_QUEUE = 256  # the runtime's queue.maxLength default
DEFAULT_QUEUE_TIMEOUT_S = 30.0  # queue.timeoutSeconds
DEFAULT_MAX_WAIT_MS = 10  # batching.maxWaitMs
_RANK = attrgetter("key")  # the scheduler's order: older first


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """How one request ended, at one pod (pod -1: no pod was ready to take it)."""

    request_id: int
    pod: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # produced
    first_token_s: float | None
    finish_s: float  # when it ended, whatever the outcome
    outcome: Outcome
    first_scheduled_s: float | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with a single token)."""
        if self.outcome != "ok" or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


class _Seq:
    """A request inside the replica (mutable; the scheduler's `Sequence` without tokens)."""

    __slots__ = (
        "arrival",
        "base",
        "blocks",
        "cached",
        "computed",
        "deadline",
        "first_scheduled",
        "first_token",
        "gbase",
        "generated",
        "hash_ids",
        "key",
        "prompt",
        "rid",
        "target",
    )

    def __init__(self, rid: int, request: TraceRequest, deadline: float | None) -> None:
        self.rid = rid
        self.arrival = request.arrival_s
        self.key = (request.arrival_s, rid)  # the scheduler's rank: older first
        self.prompt = request.prompt_tokens
        self.target = request.output_tokens
        self.hash_ids = request.hash_ids
        self.cached = 0
        self.generated = 0
        self.computed = 0
        self.blocks = 0
        self.deadline = deadline
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.base = 0  # while decoding: computed = base + step counter
        self.gbase = 0  # while decoding: generated = gbase + step counter

    @property
    def tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def uncomputed(self) -> int:
        return self.prompt + self.generated - self.computed


class SimReplica:
    def __init__(
        self,
        profile: StepProfile,
        *,
        pod: int = 0,
        batch_cap: int,
        mode: Mode = "continuous",
        max_queue: int = DEFAULT_MAX_QUEUE,
        queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
        fast: bool = True,
        start_s: float = 0.0,
        prefix_caching: bool = True,
        token_budget: int | None = None,
    ) -> None:
        if mode not in ("continuous", "static"):
            raise ValueError(f"batching mode must be continuous or static, got {mode!r}")
        if max_queue < 1 or queue_timeout_s <= 0:
            raise ValueError("the queue needs max_queue >= 1 and queue_timeout_s > 0")
        if profile.kv_blocks * profile.block_size < profile.max_model_len:
            raise ValueError(f"profile {profile.name}: the KV pool cannot hold one max_model_len")
        self.profile = profile
        self.pod = pod
        self.mode = mode
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.max_wait_s = max_wait_ms / 1000.0
        self.fast = fast
        self.bs = profile.block_size
        self.num_blocks = profile.kv_blocks
        self.used = 0  # KV blocks held
        self.clock = start_s  # when the engine is next free
        self.steps = 0  # the step counter (lazy decode state is relative to it)
        self.draining = False
        self.batch_cap = 1
        self.set_batch_cap(batch_cap)
        self.token_budget = profile.step_token_budget
        if token_budget is not None:
            self.set_token_budget(token_budget)
        self.waiting: list[_Seq] = []  # in rank order (arrival), preempted ones re-inserted
        self.prefilling: list[_Seq] = []  # running, prompt not yet computed
        self.decoding: dict[int, _Seq] = {}  # running, one token per step (lazy)
        self._base_sum = 0  # Σ base over decoding: their context is this + n·steps
        self._residues = [0] * self.bs  # decoding sequences per base mod block size
        self._finishes: list[tuple[int, int, _Seq]] = []  # (finish step, rid, seq)
        self.records: list[RequestRecord] = []  # how requests ended, in that order
        self.num_preemptions = 0
        self.num_jumps = 0  # fast-forwarded stretches (for the speed report)
        self.prefix_caching = prefix_caching
        self.prefix_cache_blocks = self.num_blocks * self.bs // HASH_BLOCK_TOKENS
        self._prefix_cache: OrderedDict[int, None] = OrderedDict()  # block id, LRU first

    # --- live parameters and gauges -----------------------------------------------------------

    def set_batch_cap(self, batch_cap: int) -> None:
        """Takes effect at the next step; lowering it only stops admissions (the runtime clamps
        to [1, KV blocks], never refuses)."""
        self.batch_cap = min(max(1, int(batch_cap)), self.num_blocks)

    def set_token_budget(self, token_budget: int) -> None:
        """The step token budget (`max_num_batched_tokens`), from the next step on; clamped to
        [1, the profile's budget], the most the runner sized its activations for, as the runtime
        clamps it."""
        self.token_budget = min(max(1, int(token_budget)), self.profile.step_token_budget)

    @property
    def num_running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.used / self.num_blocks

    @property
    def load(self) -> int:
        return self.num_running + len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.decoding or self.prefilling or self.waiting)

    # --- requests in and out ------------------------------------------------------------------

    def add(self, rid: int, request: TraceRequest) -> bool:
        """A request arriving now (the caller advanced the replica to its arrival). False: the
        queue is full and it was rejected (429)."""
        now = request.arrival_s
        if request.prompt_tokens + request.output_tokens > self.profile.max_model_len:
            raise ValueError(f"request {rid} is longer than max_model_len: clip it first")
        if len(self.waiting) >= self.max_queue:
            self._record_end(_Seq(rid, request, None), now, "rejected")
            return False
        seq = _Seq(rid, request, now + self.queue_timeout_s)
        if self.waiting and self.waiting[-1].key > seq.key:
            bisect.insort(self.waiting, seq, key=_RANK)
        else:
            self.waiting.append(seq)
        self.clock = max(self.clock, now)
        return True

    def drain(self) -> None:
        """The pod got SIGTERM: no new requests come; a static batch forms at once."""
        self.draining = True

    def stop(self, now: float) -> None:
        """Whatever is left (running or waiting) ends as dropped."""
        self._materialize()
        for seq in [*self.prefilling, *self.decoding.values(), *self.waiting]:
            self._record_end(seq, now, "dropped")
        self.prefilling, self.decoding, self.waiting = [], {}, []
        self._clear_decoding()
        self.used = 0

    def _record_end(self, seq: _Seq, now: float, outcome: Outcome) -> None:
        self.records.append(
            RequestRecord(
                request_id=seq.rid,
                pod=self.pod,
                arrival_s=seq.arrival,
                prompt_tokens=seq.prompt,
                output_tokens=seq.generated,
                first_token_s=seq.first_token,
                finish_s=now,
                outcome=outcome,
                first_scheduled_s=seq.first_scheduled,
                cached_tokens=seq.cached,
            )
        )

    # --- time ---------------------------------------------------------------------------------

    def advance_to(self, t: float) -> None:
        """Runs every step that starts before `t`."""
        while True:
            if not self.has_work():
                self.clock = max(self.clock, t)
                return
            if self.clock >= t:
                return
            self._expire(self.clock)
            if not self.has_work():
                continue
            if self.mode == "static" and not self.num_running:
                due = self._static_due_at()
                if due > self.clock:
                    deadline = self._next_deadline()
                    self.clock = min(due, deadline if deadline is not None else math.inf, t)
                    continue
            if self.fast and (self._jump(t) or self._lazy_step()):
                continue
            if not self._step():
                self.clock = t  # nothing could run (cannot happen with a valid profile)
                return

    def _static_due_at(self) -> float:
        if self.draining or len(self.waiting) >= self.batch_cap:
            return self.clock
        return self.waiting[0].arrival + self.max_wait_s  # the queue is in arrival order

    def _next_deadline(self) -> float | None:
        # Deadlines are arrival + timeout and the queue is in arrival order, so the first one
        # set is the earliest (preempted requests, re-inserted by arrival, have none).
        return next((s.deadline for s in self.waiting if s.deadline is not None), None)

    def _expire(self, now: float) -> None:
        deadline = self._next_deadline()
        if deadline is None or now < deadline:
            return
        kept = []
        for seq in self.waiting:
            if seq.deadline is not None and now >= seq.deadline:
                self._record_end(seq, now, "timeout")
            else:
                kept.append(seq)
        self.waiting = kept

    # --- the lazy decode set ------------------------------------------------------------------

    def _register_decoding(self, seq: _Seq) -> None:
        seq.base = seq.computed - self.steps
        seq.gbase = seq.generated - self.steps
        self.decoding[seq.rid] = seq
        self._base_sum += seq.base
        self._residues[seq.base % self.bs] += 1
        heapq.heappush(self._finishes, (seq.target - seq.gbase, seq.rid, seq))

    def _clear_decoding(self) -> None:
        self._base_sum = 0
        self._residues = [0] * self.bs
        self._finishes = []

    def _materialize(self) -> None:
        """Writes the decoding sequences' explicit state (computed, generated, blocks)."""
        for seq in self.decoding.values():
            seq.computed = seq.base + self.steps
            seq.generated = seq.gbase + self.steps
            seq.blocks = -(-seq.computed // self.bs)

    def _new_blocks(self, k: int) -> int:
        """KV blocks the decoding sequences add over the next k steps: step j takes a sequence
        from context c to c + 1, which needs a new block when c is a multiple of the block size."""
        if k == 1:  # the next step alone (every admission check asks)
            return self._residues[-self.steps % self.bs]
        n, bs, res = len(self.decoding), self.bs, self._residues
        cycles, rest = divmod(k, bs)
        return cycles * n + sum(res[-(self.steps + j) % bs] for j in range(rest))

    def _steps_before_overflow(self) -> int:
        """How many decode steps fit in the free KV blocks."""
        n, bs, res = len(self.decoding), self.bs, self._residues
        free = self.num_blocks - self.used
        cycles = free // n
        left = free - cycles * n
        k = cycles * bs
        for j in range(bs):
            need = res[-(self.steps + k + j) % bs]
            if need > left:
                return k + j
            left -= need
        return k + bs  # unreachable: a whole cycle needs n > left blocks

    def _steps_before(self, limit: float, alpha: float, beta: float) -> int:
        """How many steps start before `limit`: step j starts at clock + j·α + β·j(j−1)/2."""
        span = limit - self.clock
        if span <= 0:
            return 0
        if math.isinf(span):
            return 1 << 62
        half = alpha - beta / 2
        if beta > 0:
            j = math.ceil((-half + math.sqrt(half * half + 2 * beta * span)) / beta) - 1
        else:
            j = math.ceil(span / alpha) - 1
        j = max(j, 0)

        def start(i: int) -> float:
            return i * alpha + beta * i * (i - 1) / 2

        while j > 0 and start(j) >= span:  # float rounding: land on the last start before span
            j -= 1
        while start(j + 1) < span:
            j += 1
        return j + 1

    def _admission_blocked(self) -> bool:
        """True when the next step (and so every step of a decode stretch) admits nobody."""
        if not self.waiting:
            return True
        n = len(self.decoding)
        if self.mode == "static" or n >= self.batch_cap:
            return True
        budget = self.token_budget - n
        if budget <= 0:
            return True
        head = self.waiting[0]
        # Free blocks only shrink during a decode stretch, so a head that cannot fit after the
        # next step's growth cannot fit later either.
        free_after = self.num_blocks - self.used - self._new_blocks(1)
        cached = self._cached_tokens(head)
        need = -(-(cached + min(head.uncomputed - cached, budget)) // self.bs) - head.blocks
        return need > free_after

    def _jump(self, t: float) -> bool:
        """Fast-forwards a stretch of decode-only steps; False when the next step is not one."""
        n = len(self.decoding)
        if self.prefilling or not n or n > self.token_budget:
            return False
        if not self._admission_blocked():
            return False
        k_kv = self._steps_before_overflow()
        if k_kv == 0:
            return False  # the next step preempts: the exact path does it
        p = self.profile
        context = self._base_sum + n * self.steps  # Σ computed tokens now
        alpha = p.step_seconds(n, 0, context + n)  # the next step; each later one adds beta
        beta = p.d_s_per_context_token * n
        limit = t
        if self.waiting:
            deadline = self._next_deadline()
            if deadline is not None:
                limit = min(limit, deadline)
        k_time = self._steps_before(limit, alpha, beta)
        if k_time == 0:
            return False
        k_fin = self._finishes[0][0] - self.steps
        k = min(k_fin, k_kv, k_time)
        self.used += self._new_blocks(k)
        self.clock += k * alpha + beta * k * (k - 1) / 2
        self.steps += k
        self.num_jumps += 1
        self._finish_decodes()
        return True

    def _lazy_step(self) -> bool:
        """One step with prefill chunks or admissions in which the decoding sequences stay lazy:
        each takes one token of the budget and grows by the step counter, so the step costs
        O(prefilling + admitted), not O(running). It is `_step` to the last bit (the same
        integers reach the profile) whenever no sequence is preempted; False, with nothing
        changed, when one might be or the budget cannot give every decode its token: then the
        exact path runs the step."""
        n = len(self.decoding)
        budget = self.token_budget - n
        if not n or budget < 0:
            return False
        grown = self._new_blocks(1)
        free = self.num_blocks - self.used - grown
        if free < 0:
            return False  # a decode cannot grow: the exact path preempts
        bs = self.bs
        # The scheduler's order: the decode group (uncomputed == 1, here the lazy set and any
        # prefill with one token left), then prefill chunks, each by rank. Every decode gets its
        # token before any chunk, so only the chunks' order and sizes need working out.
        ranked = sorted(self.prefilling, key=_RANK)
        ones = [s for s in ranked if s.prompt + s.generated - s.computed == 1]
        if len(ones) > budget:
            return False  # the budget runs out inside the decode group: rank order decides
        chunks: list[tuple[_Seq, int]] = [(s, 1) for s in ones]
        budget -= len(ones)
        for seq in ranked:
            left = seq.prompt + seq.generated - seq.computed
            if left == 1:
                continue
            take = min(left, budget)
            if take == 0:
                continue
            chunks.append((seq, take))
            budget -= take
        for seq, take in chunks:
            need = max(0, -(-(seq.computed + take) // bs) - seq.blocks)
            if need > free:
                return False  # a chunk would preempt
            free -= need
        now = self.clock
        self.used += grown
        chosen: dict[int, tuple[_Seq, int]] = {}
        for seq, take in chunks:
            self._allocate(seq, seq.computed + take)
            chosen[id(seq)] = (seq, take)
        admitted, budget = self._admit(now, budget, n + len(ranked), chosen)
        explicit = [*ranked, *admitted]
        context = self._base_sum + n * (self.steps + 1)
        self._run_step(chosen, now, decodes=n, context=context, running=explicit)
        self._finish_decodes()
        self.prefilling = []
        for seq in explicit:
            if seq.generated > 0 and seq.prompt + seq.generated - seq.computed == 1:
                self._register_decoding(seq)
            else:
                self.prefilling.append(seq)
        return True

    def _finish_decodes(self) -> None:
        """Ends the lazy sequences whose last token came at the current step."""
        while self._finishes and self._finishes[0][0] == self.steps:
            _, _, seq = heapq.heappop(self._finishes)
            del self.decoding[seq.rid]
            self._base_sum -= seq.base
            self._residues[seq.base % self.bs] -= 1
            seq.computed = seq.base + self.steps
            seq.generated = seq.gbase + self.steps
            self.used -= -(-seq.computed // self.bs)
            self._record_end(seq, self.clock, "ok")

    # --- the prefix cache -------------------------------------------------------------------

    def _cached_tokens(self, seq: _Seq) -> int:
        """Tokens of a waiting sequence that its admission takes from the prefix cache."""
        if not self.prefix_caching or not seq.hash_ids:
            return 0
        h = HASH_BLOCK_TOKENS
        limit = min(len(seq.hash_ids), seq.prompt // h, (seq.tokens - 1) // h)
        k = 0
        while k < limit and seq.hash_ids[k] in self._prefix_cache:
            k += 1
        return k * h

    def _use_prefix(self, seq: _Seq, cached: int) -> None:
        """Admission: the sequence starts after its cached prefix, now the most recently used."""
        for block in seq.hash_ids[: cached // HASH_BLOCK_TOKENS]:
            self._prefix_cache.move_to_end(block)
        seq.computed = cached
        if seq.first_scheduled is None:
            seq.cached = cached

    def _publish_prompt(self, seq: _Seq) -> None:
        if not self.prefix_caching:
            return
        for block in seq.hash_ids[: seq.prompt // HASH_BLOCK_TOKENS]:
            self._prefix_cache[block] = None
            self._prefix_cache.move_to_end(block)
        while len(self._prefix_cache) > self.prefix_cache_blocks:
            self._prefix_cache.popitem(last=False)

    # --- one exact step (the runtime scheduler's `schedule` + `postprocess`) ------------------

    def _can_allocate(self, seq: _Seq, tokens: int) -> bool:
        return -(-tokens // self.bs) - seq.blocks <= self.num_blocks - self.used

    def _allocate(self, seq: _Seq, tokens: int) -> None:
        need = max(0, -(-tokens // self.bs) - seq.blocks)
        seq.blocks += need
        self.used += need

    def _admission_cap(self, running: int, now: float) -> int:
        if self.mode == "continuous":
            return self.batch_cap
        if running or not self.waiting:
            return 0  # a static batch runs to completion before the next forms
        return self.batch_cap if self._static_due_at() <= now else 0

    def _step(self) -> bool:
        """One step at `self.clock`, exactly as the runtime schedules it. False if nothing ran."""
        now = self.clock
        self._materialize()
        running = [*self.decoding.values(), *self.prefilling]
        self.decoding = {}
        self._clear_decoding()
        alive = set(id(s) for s in running)
        budget = self.token_budget
        chosen: dict[int, tuple[_Seq, int]] = {}  # id -> (seq, tokens this step), in order
        ranked = sorted(running, key=_RANK)
        # Decodes first, then prefill chunks (`uncomputed` written out: this is the hot loop).
        left = [s.prompt + s.generated - s.computed for s in ranked]
        order = [s for s, u in zip(ranked, left, strict=True) if u == 1]
        order += [s for s, u in zip(ranked, left, strict=True) if u > 1]
        preempted = False
        for seq in order:
            if id(seq) not in alive:
                continue  # preempted earlier in this loop
            n = min(seq.uncomputed, budget)
            if n == 0:
                continue
            while not self._can_allocate(seq, seq.computed + n):
                victims = [
                    s for s in running if id(s) in alive and s is not seq and s.key > seq.key
                ]
                victim = max(victims, key=lambda s: s.key, default=None)
                preempted = True
                if victim is None:
                    self._preempt(seq, alive)
                    break
                budget += chosen.pop(id(victim), (victim, 0))[1]
                self._preempt(victim, alive)
            else:
                self._allocate(seq, seq.computed + n)
                chosen[id(seq)] = (seq, n)
                budget -= n
        running = [s for s in running if id(s) in alive]
        if not preempted:
            admitted, budget = self._admit(now, budget, len(running), chosen)
            running += admitted
        if not chosen:
            self._regroup(running)
            return preempted
        self._run_step(chosen, now, decodes=0, context=0, running=running)
        self._regroup(running)
        return True

    def _run_step(
        self,
        chosen: dict[int, tuple[_Seq, int]],
        now: float,
        *,
        decodes: int,
        context: int,
        running: list[_Seq],
    ) -> None:
        """One engine step over the sequences `chosen` (beside `decodes` decodes already counted,
        with `context` tokens of theirs): its cost from the profile, then each sequence's tokens;
        a finished sequence leaves `running`."""
        prefill = 0
        for seq, take in chosen.values():
            if seq.prompt + seq.generated - seq.computed == 1 and seq.generated > 0:
                decodes += 1
            else:
                prefill += take
            context += seq.computed + take
            if seq.first_scheduled is None:
                seq.first_scheduled = now
        self.clock = now + self.profile.step_seconds(decodes, prefill, context)
        self.steps += 1
        for seq, take in chosen.values():
            seq.computed += take
            if seq.computed < seq.tokens:
                continue
            seq.generated += 1
            if seq.first_token is None:
                seq.first_token = self.clock
                self._publish_prompt(seq)
            if seq.generated >= seq.target:
                self.used -= seq.blocks
                seq.blocks = 0
                running.remove(seq)
                self._record_end(seq, self.clock, "ok")

    def _admit(
        self, now: float, budget: int, running: int, chosen: dict[int, tuple[_Seq, int]]
    ) -> tuple[list[_Seq], int]:
        """Admits waiting requests in arrival order while `running` (the count before) plus the
        admitted stays under the cap; returns them and the budget left."""
        cap = self._admission_cap(running, now)
        admitted: list[_Seq] = []
        for seq in self.waiting:
            if running + len(admitted) >= cap or budget == 0:
                break
            cached = self._cached_tokens(seq)
            n = min(seq.uncomputed - cached, budget)
            if not self._can_allocate(seq, cached + n):
                break  # the pool is full: keep the order rather than let small ones by
            self._use_prefix(seq, cached)
            self._allocate(seq, cached + n)
            seq.deadline = None  # admitted once: a later preemption never times it out
            admitted.append(seq)
            chosen[id(seq)] = (seq, n)
            budget -= n
        del self.waiting[: len(admitted)]
        return admitted, budget

    def _preempt(self, seq: _Seq, alive: set[int]) -> None:
        alive.discard(id(seq))
        self.used -= seq.blocks
        seq.blocks = 0
        seq.computed = 0
        self.num_preemptions += 1
        bisect.insort(self.waiting, seq, key=_RANK)

    def _regroup(self, running: list[_Seq]) -> None:
        """Splits the running sequences into the lazy decode set and the prefilling list."""
        self.prefilling = []
        for seq in running:
            if seq.generated > 0 and seq.prompt + seq.generated - seq.computed == 1:
                self._register_decoding(seq)
            else:
                self.prefilling.append(seq)


def run_single(
    profile: StepProfile,
    requests: list[TraceRequest],
    *,
    batch_cap: int,
    mode: Mode = "continuous",
    max_queue: int = DEFAULT_MAX_QUEUE,
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
    fast: bool = True,
    prefix_caching: bool = True,
) -> list[RequestRecord]:
    """One replica serving `requests` to the end (`serve_to_end`)."""
    replica = SimReplica(
        profile,
        batch_cap=batch_cap,
        mode=mode,
        max_queue=max_queue,
        queue_timeout_s=queue_timeout_s,
        max_wait_ms=max_wait_ms,
        fast=fast,
        prefix_caching=prefix_caching,
    )
    return serve_to_end(replica, requests)


def serve_to_end(replica: SimReplica, requests: list[TraceRequest]) -> list[RequestRecord]:
    """`replica` serving `requests` to the end; one record per request, in request order.
    Lengths are clipped to the profile's max_model_len first, as the fleet does."""
    requests, _ = clip_to_model(requests, replica.profile.max_model_len)
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    for i in order:
        replica.advance_to(requests[i].arrival_s)
        replica.add(i, requests[i])
    replica.advance_to(math.inf)
    return sorted(replica.records, key=lambda r: r.request_id)
