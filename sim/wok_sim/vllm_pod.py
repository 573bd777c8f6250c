"""A vLLM pod in the simulator (`wok simulate --engine vllm`): wok's replica with vLLM's
scheduler semantics where they differ from the runtime's.

The same (vLLM V1's scheduler, `vllm/v1/core/sched/scheduler.py`, and wok's both):
  - one token budget per step (`max_num_batched_tokens`), running requests first (decodes and
    unfinished prompt chunks, oldest first), then waiting ones in arrival order while the running
    count is under `max_num_seqs`, the budget lasts and KV blocks are free;
  - chunked prefill (always on in V1: a prompt longer than the budget's rest is split);
  - preemption by recompute of the newest running request when KV runs out (V1 has no swap);
  - automatic prefix caching by whole blocks (on by default in V1).
Different, and what this module changes:
  - the batch cap is `--max-num-seqs`, fixed for the life of the process: the law's batch
    changes never reach a running pod (`set_batch_cap` is ignored after start), and neither does
    a step-budget change (`--max-num-batched-tokens`);
  - no bounded queue and no queue timeout: vLLM accepts every request into its waiting queue
    (no 429) and a request waits until it is scheduled or its client gives up; the simulated
    client never gives up, so every request is served, late or not.
The step costs are the profile's; measure one for a vLLM server with `wok profile --url`.
"""

from __future__ import annotations

import math

from wok_contracts.profile import StepProfile
from wok_contracts.traces import TraceRequest
from wok_sim.replica import RequestRecord, SimReplica, serve_to_end

UNBOUNDED_QUEUE = 1 << 62  # vLLM's waiting queue has no bound


class VllmReplica(SimReplica):
    """A vLLM server process: batch cap and step budget fixed at start, an unbounded queue."""

    def __init__(
        self,
        profile: StepProfile,
        *,
        max_num_seqs: int,
        pod: int = 0,
        fast: bool = True,
        start_s: float = 0.0,
        prefix_caching: bool = True,
    ) -> None:
        self._started = False
        super().__init__(
            profile,
            pod=pod,
            batch_cap=max_num_seqs,
            mode="continuous",
            max_queue=UNBOUNDED_QUEUE,
            queue_timeout_s=math.inf,
            fast=fast,
            start_s=start_s,
            prefix_caching=prefix_caching,
        )
        self._started = True

    def set_batch_cap(self, batch_cap: int) -> None:
        if not self._started:  # the command line's --max-num-seqs
            super().set_batch_cap(batch_cap)

    def set_token_budget(self, token_budget: int) -> None:
        if not self._started:
            super().set_token_budget(token_budget)


def run_single_vllm(
    profile: StepProfile,
    requests: list[TraceRequest],
    *,
    max_num_seqs: int,
    fast: bool = True,
    prefix_caching: bool = True,
) -> list[RequestRecord]:
    """`replica.run_single` for one vLLM server."""
    replica = VllmReplica(
        profile, max_num_seqs=max_num_seqs, fast=fast, prefix_caching=prefix_caching
    )
    return serve_to_end(replica, requests)
