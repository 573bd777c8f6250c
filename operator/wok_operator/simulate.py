"""`wok simulate`: the control law against a fluid model of replicas under a scripted load.

It shows what the law does before a GPU is spent: the same `decide` the operator calls, fed by a
plant that is deliberately simple. Each replica decodes its running batch B in steps of
`step_base_s + step_per_seq_s · B` seconds, so it completes `B / (output_tokens · step(B))`
requests per second; arrivals beyond that wait in the queue. P99 is approximated as 1.2× the
service time at the running batch plus 1.5× the mean queueing delay (Little's law), smoothed over
the SLO window as a windowed histogram would be: a fluid estimate, not a queueing-theory
percentile. New replicas are pending for `startup_s` before they serve.
"""

from __future__ import annotations

from dataclasses import dataclass

from wok_operator.control import LawParams, LoopState, Observation, decide


@dataclass(frozen=True)
class Plant:
    step_base_s: float = 0.015
    step_per_seq_s: float = 0.0005
    output_tokens: int = 128
    startup_s: float = 20.0

    def step_seconds(self, batch: float) -> float:
        return self.step_base_s + self.step_per_seq_s * batch

    def requests_per_second(self, batch: float) -> float:
        return batch / (self.output_tokens * self.step_seconds(batch))


@dataclass(frozen=True)
class Phase:
    """`seconds` of arrivals (requests/s) moving linearly from `rate` to `rate_end`."""

    seconds: float
    rate: float
    rate_end: float | None = None


# A busy hour in miniature: quiet, a ramp to about three replicas' worth, a plateau, a quiet tail.
DEFAULT_SCRIPT = (
    Phase(60, 1.0),
    Phase(240, 1.0, 24.0),
    Phase(180, 24.0),
    Phase(120, 24.0, 1.0),
    Phase(300, 1.0),
)


@dataclass(frozen=True)
class Tick:
    time_s: float
    arrival_rate: float
    queue_per_replica: float
    p99_seconds: float
    batch: int
    replicas: int
    ready: int
    pending: int
    reason: str


def rate_at(script: tuple[Phase, ...], t: float) -> float:
    start = 0.0
    for phase in script:
        if t < start + phase.seconds:
            end = phase.rate if phase.rate_end is None else phase.rate_end
            return phase.rate + (end - phase.rate) * (t - start) / phase.seconds
        start += phase.seconds
    last = script[-1]
    return last.rate if last.rate_end is None else last.rate_end


def simulate(
    params: LawParams,
    *,
    initial_batch: int,
    initial_replicas: int,
    interval_s: float,
    slo_window_s: float = 60.0,
    plant: Plant = Plant(),
    script: tuple[Phase, ...] = DEFAULT_SCRIPT,
) -> list[Tick]:
    """Run the law every `interval_s` over the script; one Tick per control interval."""
    duration = sum(phase.seconds for phase in script)
    state = LoopState(batch=initial_batch, replicas=initial_replicas)
    ready_at: list[float] = [0.0] * initial_replicas
    queue = 0.0
    p99 = p99_service = 1.2 * plant.output_tokens * plant.step_seconds(initial_batch)
    ticks: list[Tick] = []
    t = 0.0
    while t < duration:
        ready = sum(1 for at in ready_at if at <= t)
        pending = len(ready_at) - ready
        rate = rate_at(script, t)
        capacity = ready * plant.requests_per_second(state.batch)
        queue = max(0.0, queue + (rate - capacity) * interval_s)
        per_replica = queue / ready if ready else float("nan")
        service = plant.output_tokens * plant.step_seconds(state.batch)
        waiting = queue / capacity if capacity else float("inf")
        smoothing = min(1.0, interval_s / slo_window_s)
        p99 += (min(1.2 * service + 1.5 * waiting, 3600.0) - p99) * smoothing
        p99_service += (1.2 * service - p99_service) * smoothing
        decision = decide(
            state,
            Observation(
                queue_per_replica=per_replica if ready else None,
                p99_seconds=p99 if capacity else None,
                p99_service_seconds=p99_service if capacity else None,
                running_per_replica=min(state.batch, rate / max(capacity, 1e-9) * state.batch)
                if ready
                else None,
                kv_usage=None,
                ready_replicas=ready,
                pending_replicas=pending,
            ),
            params,
            now=t,
        )
        if decision.replicas > len(ready_at):
            ready_at += [t + plant.startup_s] * (decision.replicas - len(ready_at))
        else:
            ready_at = sorted(ready_at)[: decision.replicas]
        ticks.append(
            Tick(
                t,
                rate,
                per_replica,
                p99,
                state.batch,
                len(ready_at),
                ready,
                pending,
                decision.reason,
            )
        )
        state = decision.state
        t += interval_s
    return ticks


def plot(ticks: list[Tick], params: LawParams, path: str) -> None:
    """The control loop over time: load, queue, batch and replicas, P99 against the SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [tick.time_s for tick in ticks]
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    axes[0].plot(t, [tick.arrival_rate for tick in ticks], color="tab:gray")
    axes[0].set_ylabel("arrivals (req/s)")
    axes[1].plot(t, [tick.queue_per_replica for tick in ticks], color="tab:blue")
    low = params.target_queue - params.deadband
    axes[1].axhspan(low, params.target_queue + params.deadband, color="tab:blue", alpha=0.15)
    axes[1].set_ylabel("queue / replica")
    axes[1].set_yscale("symlog")
    axes[2].step(t, [tick.batch for tick in ticks], where="post", label="batch size")
    axes[2].axhline(params.batch_cap, color="tab:red", linestyle=":", label="cap min(B_max, B_mem)")
    axes[2].set_ylabel("batch")
    twin = axes[2].twinx()
    twin.step(t, [tick.replicas for tick in ticks], where="post", color="tab:green")
    twin.set_ylabel("replicas", color="tab:green")
    axes[2].legend(loc="upper left")
    axes[3].plot(t, [tick.p99_seconds for tick in ticks], color="tab:purple")
    axes[3].axhline(params.slo_p99_seconds, color="tab:red", linestyle=":", label="SLO")
    axes[3].set_ylabel("P99 (s)")
    axes[3].set_yscale("log")
    axes[3].set_xlabel("time (s)")
    axes[3].legend(loc="upper left")
    fig.suptitle("wok control law: clipped sign-step on batch size and replicas")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
