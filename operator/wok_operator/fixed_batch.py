"""A batch cap fixed per pod (engine: vllm): what the law may do with it, and what status says.

vLLM cannot change `--max-num-seqs` while it runs. The law still decides a batch each tick (its
TPOT rule may step it down); the pods keep the cap they started with, unless
`batching.applyToEngine: restart` lets a change of the law's batch roll them. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wok_operator import conditions as cond
from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import MemoryBudget
from wok_operator.vllm_pod import spec_batch_cap


def law_batch_mem(spec: InferenceServiceSpec, plan: MemoryBudget) -> int:
    """B_mem as the law sees it. `applyToEngine: never` pods run the spec's cap whatever the
    observed lengths allow: the law's cap (and so the replica rule's slots per pod) is no higher
    than what the pods really run."""
    if spec.engine == "vllm" and spec.batching.apply_to_engine == "never":
        return min(plan.max_batch_size, spec_batch_cap(spec))
    return plan.max_batch_size


@dataclass(frozen=True)
class EngineBatch:
    """What the pods run after this tick, and whether the tick rolls them to it."""

    size: int
    roll: bool


def engine_batch_after(
    spec: InferenceServiceSpec, law_batch: int, running: int | None
) -> EngineBatch:
    """The --max-num-seqs the pods run after this tick: `running` (the cap the last rendered
    Deployment gave them; None: not known yet) unless `restart` lets the law's batch roll them."""
    if spec.batching.apply_to_engine == "restart" and running is not None and running != law_batch:
        return EngineBatch(law_batch, roll=True)
    return EngineBatch(running if running is not None else law_batch, roll=False)


def with_engine_batch(
    patch: dict[str, Any],
    spec: InferenceServiceSpec,
    *,
    law_batch: int,
    engine: EngineBatch,
    generation: int | None,
    now: str,
) -> dict[str, Any]:
    """The tick's status patch with `engineBatchSize` and the `BatchApplied` condition: True
    while the pods run the law's batch, False (with the two numbers) while they do not."""
    if spec.engine != "vllm":
        return patch
    if engine.roll:
        status, reason = True, "RollingPods"
        message = f"the pods roll to --max-num-seqs={engine.size}, the law's batch"
    elif engine.size == law_batch:
        status, reason = True, "EngineRunsLawBatch"
        message = f"the vLLM pods run --max-num-seqs={engine.size}, the law's batch"
    else:
        status, reason = False, "FixedPerPod"
        message = (
            f"the law would run batch {law_batch}; the vLLM pods run --max-num-seqs="
            f"{engine.size}, fixed per pod (batching.applyToEngine: never; restart rolls the "
            "pods to the law's batch)"
        )
    patch["engineBatchSize"] = engine.size
    patch["conditions"] = cond.set_condition(
        patch.get("conditions"),
        cond.BATCH_APPLIED,
        status,
        reason,
        message,
        generation=generation,
        now=now,
    )
    return patch
