"""Whether the law should move the step token budget (`max_num_batched_tokens`) too.

The budget sets how large a prefill chunk rides in one step: larger chunks finish a prompt in
fewer steps (lower TTFT, fewer fixed step costs) but stretch every step a decode shares with them
(higher TPOT). `wok-step-budget` is the law with a rule on top that moves the budget on the SLO
the budget trades: halve it on a TPOT breach, before the batch (the law's batch step down is
held that tick), and double it on a TTFT breach while TPOT has slack; `wok-step-budget-1024` is
the milder rule that never goes below 1024 (one step down). `wok-fixed-budget` is the
same law with the budget pinned at the InferenceService default, the control for the rule:
both run on the same arrivals, so a difference is what the moving budget buys
(`bench/autoscaling/step_budget.py`). Neither rule pays on the development conditions
(docs/control-law.md), so the law leaves the budget alone; these policies keep the measurement
repeatable.

Both set the budget through the fleet's `Action.token_budget`; a pod clamps it to its profile's
`step_token_budget` (the most the runner sized its activations for), so the rule can only raise
it above the default on a profile sized for more.
"""

from __future__ import annotations

from dataclasses import replace

from wok_sim.policies import REGISTRY, PolicyContext, PolicyEntry, register
from wok_sim.policy import Action, FleetView, Policy
from wok_sim.wok_policy import LawPolicy

#: The smallest budget the rule goes to: three halvings below the default 2048.
BUDGET_FLOOR = 256
#: TPOT has slack below this share of its SLO: only then may a larger chunk stretch the steps.
TPOT_SLACK = 0.8


def next_token_budget(
    budget: int,
    *,
    p99_ttft_s: float | None,
    p99_tpot_s: float | None,
    slo_ttft_s: float,
    slo_tpot_s: float,
    floor: int,
    ceiling: int,
) -> int:
    """The budget for the next tick: halved on a TPOT breach, doubled on a TTFT breach with
    TPOT slack, held otherwise (and on missing figures); always in [floor, ceiling]."""
    if p99_ttft_s is None or p99_tpot_s is None:
        return budget
    if p99_tpot_s > slo_tpot_s:
        return max(floor, budget // 2)
    if p99_ttft_s > slo_ttft_s and p99_tpot_s < TPOT_SLACK * slo_tpot_s:
        return min(ceiling, budget * 2)
    return budget


class BudgetLawPolicy:
    """The `wok` policy with the step token budget as a second fast knob (`moves=True`), or
    pinned at the InferenceService default (`moves=False`)."""

    fixed_batch: int | None = None

    def __init__(
        self,
        name: str,
        law: LawPolicy,
        ctx: PolicyContext,
        *,
        moves: bool,
        floor: int = BUDGET_FLOOR,
    ) -> None:
        self.name = name
        self.law = law
        self.interval_s = law.interval_s
        self.moves = moves
        self.ceiling = ctx.profile.step_token_budget
        self.floor = min(floor, self.ceiling)
        self.token_budget = min(law.spec.batching.max_num_batched_tokens, self.ceiling)

    def start(self) -> Action:
        return replace(self.law.start(), token_budget=self.token_budget)

    def decide(self, view: FleetView) -> Action:
        law = self.law
        before = law.state.batch
        result = law.tick(view)
        decision = result.decision
        batch = decision.batch
        if self.moves:
            budget = next_token_budget(
                self.token_budget,
                p99_ttft_s=result.observation.p99_ttft_seconds,
                p99_tpot_s=result.observation.p99_tpot_seconds,
                slo_ttft_s=law.spec.slo.ttft_p99_seconds,
                slo_tpot_s=law.spec.slo.tpot_p99_seconds,
                floor=self.floor,
                ceiling=self.ceiling,
            )
            if budget < self.token_budget:  # the budget steps down first: the batch holds
                batch = min(max(batch, before), result.params.batch_cap)
            self.token_budget = budget
        law.state = replace(decision.state, batch=batch)
        return Action(
            batch=batch,
            replicas=decision.replicas,
            reason=decision.reason,
            token_budget=self.token_budget,
        )


def _wok(ctx: PolicyContext) -> LawPolicy:
    (law,) = REGISTRY["wok"].variants(ctx)
    assert isinstance(law, LawPolicy)
    return law


def _step_budget(ctx: PolicyContext) -> list[Policy]:
    return [BudgetLawPolicy("wok-step-budget", _wok(ctx), ctx, moves=True)]


def _step_budget_1024(ctx: PolicyContext) -> list[Policy]:
    return [BudgetLawPolicy("wok-step-budget-1024", _wok(ctx), ctx, moves=True, floor=1024)]


def _fixed_budget(ctx: PolicyContext) -> list[Policy]:
    return [BudgetLawPolicy("wok-fixed-budget", _wok(ctx), ctx, moves=False)]


register("wok-step-budget", PolicyEntry(variants=_step_budget, in_all=False))
register("wok-step-budget-1024", PolicyEntry(variants=_step_budget_1024, in_all=False))
register("wok-fixed-budget", PolicyEntry(variants=_fixed_budget, in_all=False))
