"""The `wok` and `sign-step` policies: the operator's own control law, driven by the simulator; and
the batch knob's two ablations, `wok-frozen-cap` and `wok-frozen-plan`: the same law with its
batch pinned (at min(B_max, B_mem), or at `wok plan`'s B_opt for the trace's mix) every tick, so
that what the moving batch buys is measured on the same arrivals.

No copy of the law: the spec is an `InferenceServiceSpec` (defaults, plus the SLOs and replica
limits of the run), the parameters come from `LawParams.from_spec`, each tick goes through the
operator's `observe` (signals and pods → Observation) and `decide` (or `decide_sign_step`, the
plain clipped sign-step the law started from, kept for comparison), and the law's memory is
carried from tick to tick as the operator carries it in status.
"""

from __future__ import annotations

from dataclasses import replace

from wok_contracts.signals import Observation
from wok_contracts.slos import Slos
from wok_operator.api import InferenceServiceSpec, StepProfileSpec
from wok_operator.budget import sequence_length
from wok_operator.control import Decision, LawParams, LoopState, decide
from wok_operator.loop import Law, TickResult, control_tick, initial_state
from wok_operator.plan import WARM_START_S, LengthMix, batch_sla, plan
from wok_sim.policies import PolicyContext, PolicyEntry, register
from wok_sim.policy import Action, FleetView, Policy
from wok_sim.sign_step import decide_sign_step


def simulated_spec(ctx: PolicyContext, *, profile: bool = True) -> InferenceServiceSpec:
    """The InferenceService of the simulated service: defaults, with the run's SLOs, replica
    limits (minReplicas 1), the profile's max_model_len and the pod start time (its owner would
    write the deployment's own start time in the spec), and the run's step profile as its
    `scaling.stepProfile` (`wok profile`'s fit, as an owner would give it) unless `profile` is
    False (the law without one: μ waits for a saturated pod)."""
    step_profile = StepProfileSpec.of(ctx.profile).model_dump() if profile else None
    return InferenceServiceSpec.model_validate(
        {
            "slo": {
                "ttft_p99_seconds": ctx.slo_ttft_s,
                "tpot_p99_seconds": ctx.slo_tpot_s,
                "e2e_p99_seconds": ctx.slo_e2e_s,
            },
            "scaling": {
                "min_replicas": 1,
                "max_replicas": ctx.max_replicas,
                "pod_start_seconds": round(ctx.cold_start_s),
                "step_profile": step_profile,
            },
            "memory": {"max_model_len": ctx.profile.max_model_len},
        }
    )


class LawPolicy:
    """A policy that runs one of the operator's law functions on the operator's observation."""

    fixed_batch: int | None = None

    def __init__(
        self,
        name: str,
        law: Law,
        ctx: PolicyContext,
        *,
        pinned_batch: int | None = None,
        profile: bool = True,
        sla: bool = False,
    ) -> None:
        self.spec = simulated_spec(ctx, profile=profile)
        self.name = name
        self.law = law
        self.kv_tokens = ctx.profile.kv_capacity_tokens
        self.length: int | None = None
        params = LawParams.from_spec(self.spec, batch_mem=self.batch_mem(None))
        self.interval_s = float(self.spec.scaling.interval_seconds)
        self.pinned_batch = pinned_batch  # an ablation's batch (clipped to B_mem); None: moves
        self.batch_sla = batch_sla_of(ctx) if sla else None
        self.state = replace(initial_state(self.spec, params), replicas=ctx.start_replicas)
        self.state = replace(self.state, batch=self.pinned(self.state.batch, params.batch_cap))

    def batch_mem(self, mean_sequence_tokens: float | None) -> int:
        """B_mem as the operator sizes it (`handlers.budget_in_force`) from the same signal; without
        one (no completions in the window) the last length stays in force, as in status."""
        self.length = sequence_length(self.spec.memory, mean_sequence_tokens, self.length)
        return self.kv_tokens // self.length

    def start(self) -> Action:
        return Action(batch=self.state.batch, replicas=self.state.replicas, reason="initial state")

    def pinned(self, batch: int, cap: int) -> int:
        """The batch the law runs with: the one it chose, or the ablation's pin (never above the
        cap)."""
        return batch if self.pinned_batch is None else min(self.pinned_batch, cap)

    def tick(self, view: FleetView) -> TickResult:
        """The operator's observe → decide on this view (the law's memory is not yet moved)."""
        return control_tick(
            self.spec,
            self.state,
            view.signals,
            view.pod_views,
            batch_mem=self.batch_mem(view.signals.mean_sequence_tokens),
            now=view.now,
            law=self.law,
            batch_sla=self.batch_sla,
        )

    def decide(self, view: FleetView) -> Action:
        result = self.tick(view)
        decision = result.decision
        # An ablation overrides the batch of every decision and leaves the replica rule alone.
        batch = self.pinned(decision.batch, result.params.batch_cap)
        self.state = replace(decision.state, batch=batch)
        return Action(batch=self.state.batch, replicas=decision.replicas, reason=decision.reason)


def seen_mix(ctx: PolicyContext) -> LengthMix | None:
    """The length mix a running service had seen when the run begins: its first five minutes,
    as the warm start reads them (None: no request)."""
    seen = [r for r in ctx.requests if r.arrival_s < WARM_START_S] or list(ctx.requests[:1])
    return LengthMix.of_requests(seen, ctx.profile.max_model_len) if seen else None


def batch_sla_of(ctx: PolicyContext) -> int | None:
    """B_SLA for the seen mix and the run's SLOs (None: no mix, or not even one sequence)."""
    mix = seen_mix(ctx)
    if mix is None:
        return None
    sla = batch_sla(ctx.profile, mix, Slos(ctx.slo_ttft_s, ctx.slo_tpot_s, ctx.slo_e2e_s))
    return sla if sla >= 1 else None


def _wok(ctx: PolicyContext) -> list[Policy]:
    return [LawPolicy("wok", decide, ctx)]


def _no_profile(ctx: PolicyContext) -> list[Policy]:
    """The law of an InferenceService without `scaling.stepProfile`: μ is what a saturated pod
    showed, in requests/s, whatever the mix since."""
    return [LawPolicy("wok-no-profile", decide, ctx, profile=False)]


def _sla(ctx: PolicyContext) -> list[Policy]:
    """The law with B_SLA in its batch cap: it served more at tight TPOT and less on the code
    trace at loose SLOs (docs/control-law.md), so the default leaves it out."""
    return [LawPolicy("wok-sla", decide, ctx, sla=True)]


def _forgive(ctx: PolicyContext) -> list[Policy]:
    """The law whose own shortfall's misses do not spend the error budget."""

    def law(state: LoopState, obs: Observation, params: LawParams, now: float) -> Decision:
        return decide(state, obs, replace(params, forgive_own_misses=True), now)

    return [LawPolicy("wok-forgive", law, ctx)]


register("wok", PolicyEntry(variants=_wok))
register("wok-no-profile", PolicyEntry(variants=_no_profile, in_all=False))
register("wok-forgive", PolicyEntry(variants=_forgive, in_all=False))


def _no_floor(ctx: PolicyContext) -> list[Policy]:
    """The law without the proven floor: a scale-down goes as far as demand at the believed μ."""

    def law(state: LoopState, obs: Observation, params: LawParams, now: float) -> Decision:
        return decide(state, obs, replace(params, proven_floor=False), now)

    return [LawPolicy("wok-no-floor", law, ctx)]


register("wok-no-floor", PolicyEntry(variants=_no_floor, in_all=False))
register("wok-sla", PolicyEntry(variants=_sla, in_all=False))


def plan_batch(ctx: PolicyContext) -> int:
    """`wok plan`'s B_opt for the whole trace's length mix and the run's SLOs (1 when no batch
    meets them: the planner then has no answer, and the smallest batch is the closest)."""
    mix = LengthMix.of_requests(ctx.requests, ctx.profile.max_model_len)
    try:
        return plan(ctx.profile, mix, Slos(ctx.slo_ttft_s, ctx.slo_tpot_s, ctx.slo_e2e_s)).b_opt
    except ValueError:
        return 1


def _frozen_cap(ctx: PolicyContext) -> list[Policy]:
    return [LawPolicy("wok-frozen-cap", decide, ctx, pinned_batch=1 << 30)]


def _frozen_plan(ctx: PolicyContext) -> list[Policy]:
    return [LawPolicy("wok-frozen-plan", decide, ctx, pinned_batch=plan_batch(ctx))]


register("wok-frozen-cap", PolicyEntry(variants=_frozen_cap, in_all=False))
register("wok-frozen-plan", PolicyEntry(variants=_frozen_plan, in_all=False))


def _sign_step(ctx: PolicyContext) -> list[Policy]:
    return [LawPolicy("sign-step", decide_sign_step, ctx)]


register("sign-step", PolicyEntry(variants=_sign_step))
