"""Dynamo's SLA planner (aggregated, throughput-based) as a simulator policy (`wok_sim.dynamo`).

Every adjustment interval (180 s) the planner reads, from the frontend's metrics over the last
interval, the request count and the mean input and output lengths, feeds each to its load
predictor, and sizes the fleet for the predicted rate at the engine capacity its performance
model gives under the TTFT and ITL targets. The simulator's frontend is the trace: the requests
that arrived in the interval (their output lengths stand for the completed requests' mean, which
the frontend reports). The performance model is the run's step profile; the engine's step budget
and KV capacity are the profile's, its max_num_seqs the pod's batch cap B; the GPU budget is the
run's max replicas; the ITL target is the TPOT SLO.

- `dynamo-planner`: the constant predictor, targets at the run's SLOs, every fixed batch B;
- `dynamo-planner-arima`, `dynamo-planner-prophet` (not in `all`; need the `field` extra);
- `dynamo-planner-swept` (not in `all`): the targets scaled by `SLA_SCALES`, each variant named
  with its scale, for `wok evaluate`'s swept baselines.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

from wok_sim import dynamo
from wok_sim.policies import PolicyContext, PolicyEntry, register
from wok_sim.policy import Action, FleetView, Policy

SLA_SCALES = (0.2, 0.4, 0.6, 0.8, 1.0)


class DynamoPlannerPolicy:
    """The aggregated SLA planner's throughput loop."""

    interval_s = dynamo.ADJUSTMENT_INTERVAL_S

    def __init__(
        self,
        name: str,
        *,
        predictor: str,
        batch: int,
        ctx: PolicyContext,
        sla_scale: float = 1.0,
    ) -> None:
        self.name = name
        self.batch = batch
        self.fixed_batch: int | None = batch
        self.initial = ctx.start_replicas
        self.max_replicas = ctx.max_replicas
        self.ttft_ms = 1000.0 * ctx.slo_ttft_s * sla_scale
        self.itl_ms = 1000.0 * ctx.slo_tpot_s * sla_scale
        self.profile = ctx.profile
        self.wall_time = dynamo.profile_wall_time(ctx.profile)
        self.arrivals = [r.arrival_s for r in ctx.requests]
        self.requests = ctx.requests
        self.num_req = dynamo.make_predictor(predictor)
        self.isl = dynamo.make_predictor(predictor)
        self.osl = dynamo.make_predictor(predictor)

    def start(self) -> Action:
        return Action(batch=self.batch, replicas=self.initial, reason="initial")

    def _observe(self, now: float) -> int:
        """The frontend's figures over the last interval, into the predictors; the count."""
        first = bisect.bisect_right(self.arrivals, now - self.interval_s)
        last = bisect.bisect_right(self.arrivals, now)
        window = self.requests[first:last]
        count = len(window)
        self.num_req.add_data_point(float(count))
        self.isl.add_data_point(sum(r.prompt_tokens for r in window) / count if count else math.nan)
        self.osl.add_data_point(sum(r.output_tokens for r in window) / count if count else math.nan)
        return count

    def decide(self, view: FleetView) -> Action:
        if self._observe(view.now) == 0:  # no traffic: Metrics.is_valid() fails, no adjustment
            return Action(batch=self.batch, replicas=view.replicas, reason="no traffic: hold")
        num_req, isl, osl = (p.predict_next() for p in (self.num_req, self.isl, self.osl))
        engine_rps, ttft_ms, itl_ms = dynamo.find_best_engine_agg_rps(
            self.wall_time,
            isl=isl,
            osl=osl,
            max_num_batched_tokens=self.profile.step_token_budget,
            ttft_sla_ms=self.ttft_ms,
            itl_sla_ms=self.itl_ms,
            max_kv_tokens=self.profile.kv_capacity_tokens,
            max_num_seqs=self.batch,
        )
        desired = dynamo.agg_replicas(
            num_req / self.interval_s, engine_rps, max_replicas=self.max_replicas
        )
        if desired is None:
            return Action(batch=self.batch, replicas=view.replicas, reason="no capacity model")
        reason = (
            f"{num_req / self.interval_s:.2f} rps / {engine_rps:.2f} per engine "
            f"(TTFT {ttft_ms:.0f} ms, ITL {itl_ms:.0f} ms)"
        )
        return Action(batch=self.batch, replicas=desired, reason=reason)


def _variants(
    predictor: str, scales: tuple[float, ...], *, base: str, named: bool
) -> Callable[[PolicyContext], list[Policy]]:
    def variants(ctx: PolicyContext) -> list[Policy]:
        return [
            DynamoPlannerPolicy(
                f"{base}-{scale:g}" if named else base,
                predictor=predictor,
                batch=b,
                ctx=ctx,
                sla_scale=scale,
            )
            for scale in scales
            for b in ctx.sweep_batches()
        ]

    return variants


register(
    "dynamo-planner",
    PolicyEntry(
        variants=_variants("constant", (1.0,), base="dynamo-planner", named=False),
        in_all=False,
    ),
)
for _predictor in ("arima", "prophet"):
    _name = f"dynamo-planner-{_predictor}"
    register(
        _name,
        PolicyEntry(variants=_variants(_predictor, (1.0,), base=_name, named=False), in_all=False),
    )
register(
    "dynamo-planner-swept",
    PolicyEntry(
        variants=_variants("constant", SLA_SCALES, base="dynamo-planner", named=True),
        in_all=False,
    ),
)
