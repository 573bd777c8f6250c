"""llm-d's Workload Variant Autoscaler (queueing model, one variant) as a simulator policy.

Every optimization interval (60 s, `GLOBAL_OPT_INTERVAL`) WVA reads the variant's load — the
rate of `vllm:request_success_total` and the mean prompt and generation lengths — and sizes it
with its queueing model (`wok_sim.wva`) against the service class's TTFT and ITL targets. In the
simulator the rate is the operator's completion rate (`finished_per_s`, the same counter), the
lengths the means of the requests that arrived over the interval, and the targets the run's TTFT
and TPOT SLOs (WVA's targets are means; the SLOs are P99s: the swept variant scales them).

WVA's α, β, γ come from offline benchmarks or its Kalman tuner; here they are set from the run's
step profile so that WVA's iteration time at the current mix equals wok's:
α = a, γ = d (per token of KV read), and β such that β per compute token covers the profile's
per-sequence cost and the prompt's share, b + c·in/(out+1), per iteration. Max batch is the pod's
batch cap B.

- `wva`: targets at the SLOs, every fixed batch B;
- `wva-swept` (not in `all`): the targets scaled by `TARGET_SCALES`, each variant named with its
  scale, for `wok evaluate`'s swept baselines.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from wok_contracts.profile import StepCosts
from wok_sim import wva
from wok_sim.policies import PolicyContext, PolicyEntry, register
from wok_sim.policy import Action, FleetView, Policy

OPTIMIZATION_INTERVAL_S = 60.0
TARGET_SCALES = (0.2, 0.4, 0.6, 0.8, 1.0)


def service_parms(costs: StepCosts, size: wva.RequestSize) -> wva.ServiceParms:
    """α, β, γ (ms) with WVA's iteration time equal to the profile's at this request mix."""
    compute_tokens = (size.avg_input_tokens + size.avg_output_tokens) / (size.avg_output_tokens + 1)
    per_sequence = costs.b_s_per_seq + costs.c_s_per_prefill_token * size.avg_input_tokens / (
        size.avg_output_tokens + 1
    )
    return wva.ServiceParms(
        alpha=1000.0 * costs.a_s,
        beta=1000.0 * per_sequence / compute_tokens,
        gamma=1000.0 * costs.d_s_per_context_token,
    )


class WvaPolicy:
    """WVA's queueing-model sizing of one variant."""

    interval_s = OPTIMIZATION_INTERVAL_S

    def __init__(self, name: str, *, batch: int, ctx: PolicyContext, scale: float = 1.0) -> None:
        self.name = name
        self.batch = batch
        self.fixed_batch: int | None = batch
        self.initial = ctx.start_replicas
        self.max_replicas = ctx.max_replicas
        self.profile = ctx.profile
        self.target = wva.TargetPerf(
            ttft_ms=1000.0 * ctx.slo_ttft_s * scale, itl_ms=1000.0 * ctx.slo_tpot_s * scale
        )
        self.requests = ctx.requests
        self.arrivals = [r.arrival_s for r in ctx.requests]

    def start(self) -> Action:
        return Action(batch=self.batch, replicas=self.initial, reason="initial")

    def _size(self, now: float) -> wva.RequestSize | None:
        first = bisect.bisect_right(self.arrivals, now - self.interval_s)
        window = self.requests[first : bisect.bisect_right(self.arrivals, now)]
        if not window:
            return None
        return wva.RequestSize(
            avg_input_tokens=sum(r.prompt_tokens for r in window) / len(window),
            avg_output_tokens=sum(r.output_tokens for r in window) / len(window),
        )

    def decide(self, view: FleetView) -> Action:
        rate = view.signals.finished_per_s
        size = self._size(view.now)
        if rate is None or size is None:
            return Action(batch=self.batch, replicas=view.replicas, reason="no load: hold")
        desired = wva.replicas_for(
            rate,
            size,
            parms=service_parms(self.profile, size),
            max_batch=self.batch,
            target=self.target,
        )
        if desired is None:  # no feasible allocation: upstream leaves the variant as it is
            return Action(batch=self.batch, replicas=view.replicas, reason="infeasible: hold")
        replicas = min(desired, self.max_replicas)
        return Action(batch=self.batch, replicas=replicas, reason=f"{rate:.2f} rps: {desired}")


def _variants(scales: tuple[float, ...], *, named: bool) -> Callable[[PolicyContext], list[Policy]]:
    def variants(ctx: PolicyContext) -> list[Policy]:
        return [
            WvaPolicy(f"wva-{scale:g}" if named else "wva", batch=b, ctx=ctx, scale=scale)
            for scale in scales
            for b in ctx.sweep_batches()
        ]

    return variants


register("wva", PolicyEntry(variants=_variants((1.0,), named=False), in_all=False))
register("wva-swept", PolicyEntry(variants=_variants(TARGET_SCALES, named=True), in_all=False))
