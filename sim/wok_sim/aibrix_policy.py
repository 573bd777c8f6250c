"""AIBrix's KPA and APA as simulator policies (the algorithms: `wok_sim.aibrix`).

AIBrix scrapes each pod's vLLM `/metrics` itself every 10 s sync; its samples and docs scale vLLM
on `gpu_cache_usage_perc` with a target of 0.5 (`samples/autoscaling/kpa.yaml`, `apa.yaml`), and
its multi-metric sample adds `num_requests_waiting` (target 100). The simulator's per-pod
`kv_usage` gauge is the first (the KV cache's used fraction, 0..1), its `waiting` gauge the
second. A pod still loading has no `/metrics` (the scrape fails and AIBrix leaves it out of the
mean); a draining pod still answers. minReplicas is 1, as in the samples.

- `aibrix-kpa`, `aibrix-apa`: KV usage, target 0.5, at every fixed batch B (the best in
  hindsight shown);
- `aibrix-kpa-swept`, `aibrix-apa-swept` (not in `all`): the same over `KV_TARGETS` and on the
  waiting queue over `WAITING_TARGETS`, every variant named with its metric and target, for
  `wok evaluate`'s swept baselines. The KV targets are those that act: at 0.2 and 0.5 neither
  scaled past one pod on the code trace ×3 and ×4, the conversation trace or the Mooncake
  excerpt, at any B (bench/autoscaling/results/aibrix_kv_reach.md), so they cost the matrix
  simulations and add no point to the frontier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from wok_sim import aibrix
from wok_sim.policies import PolicyContext, PolicyEntry, register
from wok_sim.policy import Action, FleetView, Policy

DEFAULT_KV_TARGET = 0.5  # samples/autoscaling/{kpa,apa}.yaml: gpu_cache_usage_perc, "0.5"
KV_TARGETS = (0.05, 0.1)
WAITING_TARGETS = (2.0, 5.0, 20.0, 100.0)  # multimetrics-apa.yaml: num_requests_waiting, "100"

Strategy = Literal["kpa", "apa"]
Metric = Literal["kv", "waiting"]


def pod_samples(view: FleetView, metric: Metric = "kv") -> list[float]:
    """The pods that answer AIBrix's scrape: every pod past its load with the gauge."""
    values = (s.kv_usage if metric == "kv" else s.waiting for s in view.pods if not s.pod.pending)
    return [v for v in values if v is not None]


class AibrixPolicy:
    """One AIBrix PodAutoscaler (KPA or APA) on one per-pod vLLM gauge."""

    interval_s = aibrix.RESYNC_INTERVAL_S

    def __init__(
        self,
        name: str,
        *,
        strategy: Strategy,
        target: float,
        batch: int,
        ctx: PolicyContext,
        metric: Metric = "kv",
    ) -> None:
        self.name = name
        self.strategy = strategy
        self.metric: Metric = metric
        self.batch = batch
        self.fixed_batch: int | None = batch
        self.scaling = aibrix.ScalingContext(
            target=target, min_replicas=1, max_replicas=ctx.max_replicas
        )
        self.initial = ctx.start_replicas
        self.windows = aibrix.MetricWindows()
        self.stabilizer = aibrix.Stabilizer()

    def start(self) -> Action:
        return Action(batch=self.batch, replicas=self.initial, reason="initial")

    def decide(self, view: FleetView) -> Action:
        current = view.replicas
        bound = aibrix.boundary_decision(self.scaling, current)
        if bound is not None:
            return Action(batch=self.batch, replicas=bound, reason="replica bounds")
        samples = pod_samples(view, self.metric)
        if not samples:  # every scrape failed: the pipeline errors and nothing moves
            return Action(batch=self.batch, replicas=current, reason="no pod metric: hold")
        self.windows.update(view.now, samples)
        stable, panic = self.windows.stable.avg(), self.windows.panic.avg()
        if self.strategy == "kpa":
            recommended = aibrix.kpa_recommendation(
                current, self.scaling, stable=stable, panic=panic
            )
        else:
            recommended = aibrix.apa_recommendation(current, self.scaling, stable=stable)
        replicas = aibrix.scale_decision(
            self.scaling, self.stabilizer, now=view.now, current=current, recommendation=recommended
        )
        reason = f"stable {stable:.3f} panic {panic:.3f}: recommend {recommended}"
        return Action(batch=self.batch, replicas=replicas, reason=reason)


def _variants(
    strategy: Strategy, targets: tuple[tuple[Metric, float], ...], *, named: bool
) -> Callable[[PolicyContext], list[Policy]]:
    def variants(ctx: PolicyContext) -> list[Policy]:
        base = f"aibrix-{strategy}"
        return [
            AibrixPolicy(
                f"{base}-{metric}-{target:g}" if named else base,
                strategy=strategy,
                target=target,
                batch=b,
                ctx=ctx,
                metric=metric,
            )
            for metric, target in targets
            for b in ctx.sweep_batches()
        ]

    return variants


SAMPLE: tuple[tuple[Metric, float], ...] = (("kv", DEFAULT_KV_TARGET),)
SWEPT: tuple[tuple[Metric, float], ...] = (
    *(("kv", t) for t in KV_TARGETS),
    *(("waiting", t) for t in WAITING_TARGETS),
)
for _strategy in ("kpa", "apa"):
    register(
        f"aibrix-{_strategy}",
        PolicyEntry(variants=_variants(_strategy, SAMPLE, named=False), in_all=False),
    )
    register(
        f"aibrix-{_strategy}-swept",
        PolicyEntry(variants=_variants(_strategy, SWEPT, named=True), in_all=False),
    )
