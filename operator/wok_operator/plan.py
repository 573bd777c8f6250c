"""Capacity planning from a step-time profile and the SLOs (`wok plan`): what one replica sustains.

It gives `B_opt`, the batch at the throughput knee that the SLO allows,
`QPS_max = B_opt / t_batch`, the replicas a target rate needs and the cost per token. All follow
from the profile's step time `a + b·decodes + c·prefill + d·context` in steady state, with the
runtime's semantics (the simulator's, `replica.py`):

- Request i (prompt P_i, output O_i) holds a batch slot for s_i = k_i + O_i − 1 steps: k_i prefill
  steps (its prompt in chunks of the room decodes leave in the step's token budget, taken as
  budget − B, the room when every slot decodes), which yield its first token, then one step per
  further token.
- With B slots busy, requests start at x = B / E[s] per step (Little's law). A step then carries
  x·E[O − 1] decodes, x·E[P] prefill tokens and x·E[ctx_i] context tokens, ctx_i being what
  request i reads over its life (Σ of its context at each step). The averages weigh every request
  by its time in the batch, as a running batch does: long answers hold slots longer.
- So the step time t(B) is explicit; TPOT = t, TTFT_i = k_i·t, E2E_i = s_i·t, and a replica serves
  x / t requests per second. Queueing is left out: it is what the replica count is for.

`B_opt` is the B of most throughput among those where at least 99 % of the length mix meets every
SLO and the steady state fits the step's token budget and the KV pool. Latency grows with B, so
the feasible batches are 1 … B_opt and a bisection finds it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from wok_contracts.profile import StepProfile
from wok_contracts.quantiles import nearest_rank
from wok_contracts.slos import Slos
from wok_contracts.traces import TraceRequest, clip_to_model

if TYPE_CHECKING:
    from wok_operator.api import StepProfileSpec

TARGET_ATTAINMENT = 0.99  # the share of requests that must meet every SLO at B_opt


@dataclass(frozen=True)
class LengthMix:
    """The prompt and output lengths the replicas serve: a trace's, or one mean request."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.prompts or len(self.prompts) != len(self.outputs):
            raise ValueError("a length mix needs at least one request, with prompt and output")
        if min(self.prompts) < 1 or min(self.outputs) < 1:
            raise ValueError("prompt and output lengths must be >= 1 token")

    @classmethod
    def of_means(cls, prompt_tokens: int, output_tokens: int) -> LengthMix:
        return cls((prompt_tokens,), (output_tokens,))

    @classmethod
    def of_requests(cls, requests: Sequence[TraceRequest], max_model_len: int) -> LengthMix:
        """A trace's lengths, clipped to the model as the runtime and the simulator clip them."""
        clipped, _ = clip_to_model(list(requests), max_model_len)
        return cls(tuple(r.prompt_tokens for r in clipped), tuple(r.output_tokens for r in clipped))

    @property
    def mean_prompt(self) -> float:
        return sum(self.prompts) / len(self.prompts)

    @property
    def mean_output(self) -> float:
        return sum(self.outputs) / len(self.outputs)

    @cached_property
    def mean_square_prompt(self) -> float:
        return sum(p * p for p in self.prompts) / len(self.prompts)

    @cached_property
    def decoding_outputs(self) -> tuple[tuple[int, int], ...]:
        """(output length, how many requests) for the lengths with a TPOT (two tokens or more)."""
        return tuple(sorted((o, k) for o, k in Counter(self.outputs).items() if o >= 2))


def arrival_rate(requests: Sequence[TraceRequest]) -> float | None:
    """A trace's mean arrival rate (requests/s over its span); None when it spans no time."""
    span = max((r.arrival_s for r in requests), default=0.0)
    return len(requests) / span if span > 0 else None


def peak_rate(requests: Sequence[TraceRequest], window_s: float) -> float:
    """The most arrivals in any `window_s` window, per second."""
    times = sorted(r.arrival_s for r in requests)
    most, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most / window_s


@dataclass(frozen=True)
class BatchPoint:
    """One replica's steady state at a running batch B."""

    batch: int
    step_s: float  # the mean step: the mean TPOT
    p99_tpot_s: float
    time_in_batch_s: float  # mean over the mix: t_batch
    requests_per_s: float
    output_tokens_per_s: float
    p99_ttft_s: float
    p99_e2e_s: float
    attainment: float  # share of the mix meeting every SLO (service time only, no queueing)
    token_load: float  # share of the step token budget used
    kv_load: float  # share of the KV pool held

    @property
    def fits(self) -> bool:
        """The steady state exists: the step's token budget and the KV pool hold it."""
        return self.token_load <= 1.0 and self.kv_load <= 1.0

    def meets(self, target: float = TARGET_ATTAINMENT) -> bool:
        return self.fits and self.attainment >= target


def _share_below(limit: float, mean: float, spread: float) -> float:
    """P(X ≤ limit) for X normal around `mean` with standard deviation `spread`."""
    if spread <= 0:
        return 1.0 if mean <= limit else 0.0
    return 0.5 * (1.0 + math.erf((limit - mean) / (spread * math.sqrt(2.0))))


def _mixture_p99(mean: float, spreads: Sequence[tuple[float, int]]) -> float:
    """The 99th percentile of TPOT over requests whose TPOTs are normal around `mean`, with
    (spread, how many requests) pairs."""
    total = sum(k for _, k in spreads)
    if not total:
        return mean
    lo, hi = mean, mean + 4.0 * max(sd for sd, _ in spreads)
    for _ in range(40):
        mid = (lo + hi) / 2
        share = sum(k * _share_below(mid, mean, sd) for sd, k in spreads) / total
        lo, hi = (mid, hi) if share < 0.99 else (lo, mid)
    return hi


def batch_point(profile: StepProfile, mix: LengthMix, batch: int, slos: Slos) -> BatchPoint:
    """The steady state at running batch `batch` (see the module docstring for the model)."""
    if not 1 <= batch < profile.step_token_budget:
        raise ValueError(f"batch must be in [1, {profile.step_token_budget - 1}], got {batch}")
    room = profile.step_token_budget - batch
    n = len(mix.prompts)
    prefill_steps = [-(-p // room) for p in mix.prompts]
    slot_steps = [k + o - 1 for k, o in zip(prefill_steps, mix.outputs, strict=True)]
    # Context read over a request's life: its prompt chunks' ends, then P + g at decode g.
    contexts = [
        p * (k + 1) / 2 + (o - 1) * p + (o - 1) * o / 2
        for p, o, k in zip(mix.prompts, mix.outputs, prefill_steps, strict=True)
    ]
    starts = batch / (sum(slot_steps) / n)  # x: requests entering per step
    decodes = starts * (mix.mean_output - 1)
    prefill = starts * mix.mean_prompt
    context = starts * sum(contexts) / n
    step = profile.step_seconds(decodes, prefill, context)
    # A request's TPOT averages the steps of its O − 1 decodes. Prompts land in some steps and not
    # in others (a compound Poisson count of prompt tokens: variance x·E[P²] per step), so the TPOT
    # of a short answer spreads widely around t, that of a long one hardly.
    spread_one = profile.c_s_per_prefill_token * math.sqrt(starts * mix.mean_square_prompt)
    spreads = [(spread_one / math.sqrt(o - 1), k) for o, k in mix.decoding_outputs]
    tpot_ok = {
        o: _share_below(slos.tpot_s, step, sd)
        for (o, _), (sd, _) in zip(mix.decoding_outputs, spreads, strict=True)
    }
    e2e_slo = math.inf if slos.e2e_s is None else slos.e2e_s
    met = sum(
        tpot_ok.get(o, 1.0)
        for k, s, o in zip(prefill_steps, slot_steps, mix.outputs, strict=True)
        if k * step <= slos.ttft_s and s * step <= e2e_slo
    )
    rate = starts / step
    return BatchPoint(
        batch=batch,
        step_s=step,
        p99_tpot_s=_mixture_p99(step, spreads),
        time_in_batch_s=batch / rate,
        requests_per_s=rate,
        output_tokens_per_s=rate * mix.mean_output,
        p99_ttft_s=nearest_rank([k * step for k in prefill_steps]),
        p99_e2e_s=nearest_rank([s * step for s in slot_steps]),
        attainment=met / n,
        token_load=(decodes + prefill) / profile.step_token_budget,
        kv_load=context / profile.kv_capacity_tokens,
    )


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The largest b in [lo, hi] with ok(b), for a predicate true up to a point (lo − 1: none)."""
    if not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def batch_limit(profile: StepProfile, mix: LengthMix, slos: Slos) -> int:
    """The largest batch whose steady state fits the step budget and the KV pool (≥ 1)."""
    top = profile.step_token_budget - 1
    return max(1, _largest(1, top, lambda b: batch_point(profile, mix, b, slos).fits))


def batch_sla(profile: StepProfile, mix: LengthMix, slos: Slos) -> int:
    """B_SLA: the largest batch whose predicted step time (the mean TPOT) for the mix is within
    the TPOT SLO and whose steady state fits (0: not even one sequence). The step, not the
    predicted P99: prompts landing in a step spread a short answer's TPOT, and a cap sized to
    that spread starves a prefill-bound pod of the batch it serves well."""
    top = batch_limit(profile, mix, slos)
    return _largest(1, top, lambda b: batch_point(profile, mix, b, slos).step_s <= slos.tpot_s)


def replica_capacity(profile: StepProfile, mix: LengthMix, batch: int, slos: Slos) -> float:
    """Requests per second one replica serves running `batch` sequences (or as many as fit)."""
    b = min(batch, batch_limit(profile, mix, slos))
    return batch_point(profile, mix, b, slos).requests_per_s


@dataclass(frozen=True)
class Plan:
    profile: str
    requests_in_mix: int
    mean_prompt_tokens: float
    mean_output_tokens: float
    slos: Slos
    batch_limit: int  # what the step budget and KV pool allow, SLOs aside
    b_opt: int
    at_b_opt: BatchPoint
    curve: tuple[BatchPoint, ...]  # for the table and the plot, B_opt included
    qps: float | None  # the target rate asked for
    replicas: int | None  # replicas that target needs

    @property
    def qps_max(self) -> float:
        """B_opt / t_batch: requests per second one replica sustains within the SLOs."""
        return self.at_b_opt.requests_per_s

    @property
    def gpu_seconds_per_output_token(self) -> float:
        return 1.0 / self.at_b_opt.output_tokens_per_s

    @property
    def gpu_hours_per_1k_output_tokens(self) -> float:
        return 1000.0 * self.gpu_seconds_per_output_token / 3600.0


def _curve_batches(limit: int, b_opt: int) -> list[int]:
    batches = {b_opt, limit}
    b = 1
    while b <= limit:
        batches.add(b)
        b = b + 1 if b < 8 else math.ceil(b * 1.25)
    return sorted(batches)


def plan(profile: StepProfile, mix: LengthMix, slos: Slos, *, qps: float | None = None) -> Plan:
    """B_opt, QPS_max, C_token and the replicas for `qps`; ValueError when no batch meets the
    SLOs (the reason names the binding one at B = 1)."""
    if qps is not None and not (qps > 0 and math.isfinite(qps)):
        raise ValueError(f"--qps must be a positive number, got {qps}")
    limit = batch_limit(profile, mix, slos)
    b_feasible = _largest(1, limit, lambda b: batch_point(profile, mix, b, slos).meets())
    if b_feasible < 1:
        one = batch_point(profile, mix, 1, slos)
        raise ValueError(
            f"no batch size meets the SLOs for {TARGET_ATTAINMENT:.0%} of requests: at B = 1, "
            f"TPOT {one.step_s:.3f} s, P99 TTFT {one.p99_ttft_s:.2f} s, P99 E2E "
            f"{one.p99_e2e_s:.2f} s, attainment {one.attainment:.1%}"
        )
    candidates = [
        batch_point(profile, mix, b, slos) for b in _curve_batches(b_feasible, b_feasible)
    ]
    best = max(candidates, key=lambda p: (p.requests_per_s, -p.batch))
    curve = tuple(batch_point(profile, mix, b, slos) for b in _curve_batches(limit, best.batch))
    return Plan(
        profile=profile.name,
        requests_in_mix=len(mix.prompts),
        mean_prompt_tokens=mix.mean_prompt,
        mean_output_tokens=mix.mean_output,
        slos=slos,
        batch_limit=limit,
        b_opt=best.batch,
        at_b_opt=best,
        curve=curve,
        qps=qps,
        replicas=None if qps is None else math.ceil(qps / best.requests_per_s),
    )


def batch_mem_of(profile: StepProfile, requests: Sequence[TraceRequest]) -> int:
    """B_mem as the operator settles it with `lengthEstimate: observedMean` (the default): the
    KV pool over the trace's mean sequence length."""
    clipped, _ = clip_to_model(list(requests), profile.max_model_len)
    mean = sum(r.prompt_tokens + r.output_tokens for r in clipped) / max(len(clipped), 1)
    return max(1, int(profile.kv_capacity_tokens // max(mean, 1.0)))


#: What a service already running when a trace begins has seen of it: its first five minutes.
WARM_START_S = 300.0


def warm_start(profile: StepProfile, requests: Sequence[TraceRequest], slos: Slos) -> int:
    """Every autoscaler starts with the fleet the planner sizes for the busiest minute of the
    first five, as a service already running when the trace begins would be sized for the load
    it has just seen (starting cold at one pod would charge each policy for a ramp the trace
    never asked for)."""
    first_minutes = [r for r in requests if r.arrival_s < WARM_START_S]
    if not first_minutes:
        return 1
    mix = LengthMix.of_requests(requests, profile.max_model_len)
    per_replica = replica_capacity(profile, mix, profile.kv_blocks, slos)
    return max(1, math.ceil(peak_rate(first_minutes, 60.0) / per_replica))


#: Means within 2 % of each other share one capacity (log-spaced buckets, 50 per e-fold).
MIX_BUCKETS_PER_E = 50


def mix_capacity(
    profile: StepProfileSpec,
    max_model_len: int,
    slos: Slos,
    mean_prompt: float | None,
    mean_output: float | None,
) -> float | None:
    """QPS_max for a service finishing requests of these mean lengths: what a pod serves within
    the SLOs by the profile (None: no mix seen, or no batch meets the SLOs for it)."""
    means = (mean_prompt, mean_output)
    if not all(m is not None and math.isfinite(m) and m > 0 for m in means):
        return None
    prompt, output = (round(MIX_BUCKETS_PER_E * math.log(max(m, 1.0))) for m in means)  # type: ignore[arg-type]
    return _bucket_capacity(profile, max_model_len, slos, prompt, output)


@lru_cache(maxsize=4096)
def _bucket_capacity(
    profile: StepProfileSpec, max_model_len: int, slos: Slos, prompt: int, output: int
) -> float | None:
    prompt_tokens, output_tokens = (
        max(1, round(math.exp(b / MIX_BUCKETS_PER_E))) for b in (prompt, output)
    )
    mix = LengthMix.of_means(prompt_tokens, output_tokens)
    try:
        return plan(profile.profile(max_model_len), mix, slos).qps_max
    except ValueError:
        return None
