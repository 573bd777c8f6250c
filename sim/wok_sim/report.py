"""What a fleet run means for users and for the bill: SLO attainment, P99s, GPU-hours, churn.

A request attains TTFT when its first token came within `slo_ttft_s` of its arrival, TPOT when
its mean time per output token after the first is within `slo_tpot_s` (single-token answers pass),
E2E when it finished within `slo_e2e_s` (no E2E SLO: finishing is enough); rejected, timed-out and
dropped requests miss all three. P99s are over the requests that completed (the misses are counted
apart, as `rejected`, `timeouts` and `dropped`). GPU-hours count every pod from its creation
(pending pods bill) to its exit, within the trace's duration. The prefix-cache hit rate is the
share of prompt tokens that admitted requests found cached (vLLM's hits over queries).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wok_sim.fleet import FleetRun, Tick


@dataclass(frozen=True)
class Slos:
    ttft_s: float
    tpot_s: float
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0 and (self.e2e_s is None or self.e2e_s > 0)):
            raise ValueError("SLOs must be > 0 seconds")


@dataclass(frozen=True)
class PolicyResult:
    name: str
    batch_size: int | None  # the fixed B of a fixed-batch baseline, None when it moves
    requests: int
    slo_attainment: float
    ttft_attainment: float
    tpot_attainment: float
    e2e_attainment: float
    p99_ttft_s: float | None
    p99_tpot_s: float | None
    p99_e2e_s: float | None
    gpu_hours: float
    gpu_hours_per_1k_tokens: float | None
    output_tokens: int
    scale_events: int
    flips: int
    max_queue: int
    rejected: int  # queue full (429) or no ready pod (503)
    timeouts: int
    dropped: int
    clipped_requests: int
    wall_seconds: float
    steps: int
    timeline: tuple[Tick, ...]
    prefix_hit_rate: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "slo_attainment": self.slo_attainment,
            "ttft_attainment": self.ttft_attainment,
            "tpot_attainment": self.tpot_attainment,
            "e2e_attainment": self.e2e_attainment,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_per_1k_tokens": self.gpu_hours_per_1k_tokens,
            "p99_ttft_s": self.p99_ttft_s,
            "p99_tpot_s": self.p99_tpot_s,
            "p99_e2e_s": self.p99_e2e_s,
            "scale_events": self.scale_events,
            "flips": self.flips,
            "max_queue": self.max_queue,
            "rejected": self.rejected,
            "timeouts": self.timeouts,
            "dropped": self.dropped,
            "requests": self.requests,
            "prefix_hit_rate": self.prefix_hit_rate,
            "batch_size": self.batch_size,
            "sim_seconds": round(self.wall_seconds, 3),
        }


def p99(values: Sequence[float]) -> float | None:
    """Nearest-rank 99th percentile; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def summarize(
    name: str, run: FleetRun, slos: Slos, *, batch_size: int | None = None
) -> PolicyResult:
    total = len(run.records)
    ok = [r for r in run.records if r.outcome == "ok"]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok]
    hits = [0, 0, 0, 0]
    for r in ok:
        t1 = r.ttft_s is not None and r.ttft_s <= slos.ttft_s
        t2 = r.tpot_s is None or r.tpot_s <= slos.tpot_s
        t3 = slos.e2e_s is None or r.e2e_s <= slos.e2e_s
        for i, hit in enumerate((t1, t2, t3, t1 and t2 and t3)):
            hits[i] += hit
    share = [h / total if total else 1.0 for h in hits]
    tokens = sum(r.output_tokens for r in ok)
    gpu_hours = run.gpu_seconds / 3600.0
    admitted = [r for r in run.records if r.first_scheduled_s is not None]
    queries = sum(r.prompt_tokens for r in admitted)

    def count(outcome: str) -> int:
        return sum(1 for r in run.records if r.outcome == outcome)

    return PolicyResult(
        name=name,
        batch_size=batch_size,
        requests=total,
        ttft_attainment=share[0],
        tpot_attainment=share[1],
        e2e_attainment=share[2],
        slo_attainment=share[3],
        p99_ttft_s=p99(ttft),
        p99_tpot_s=p99(tpot),
        p99_e2e_s=p99(e2e),
        gpu_hours=gpu_hours,
        gpu_hours_per_1k_tokens=gpu_hours / (tokens / 1000.0) if tokens else None,
        output_tokens=tokens,
        scale_events=run.scale_events,
        flips=run.flips,
        max_queue=run.max_waiting,
        rejected=count("rejected"),
        timeouts=count("timeout"),
        dropped=count("dropped"),
        clipped_requests=run.clipped_requests,
        wall_seconds=run.wall_seconds,
        steps=run.steps,
        timeline=tuple(run.timeline),
        prefix_hit_rate=sum(r.cached_tokens for r in admitted) / queries if queries else 0.0,
    )


def to_json(results: Sequence[PolicyResult]) -> str:
    return json.dumps({"policies": {r.name: r.as_json() for r in results}}, indent=2)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(results: Sequence[PolicyResult]) -> str:
    header = (
        f"{'policy':<22} {'B':>4} {'all':>6} {'TTFT':>6} {'TPOT':>6} {'E2E':>6} "
        f"{'p99TTFT':>8} {'p99TPOT':>8} {'p99E2E':>8} {'GPU-h':>7} {'GPUh/1k':>8} "
        f"{'scale':>5} {'flips':>5} {'maxQ':>5} {'rej':>5} {'tmo':>5} {'drop':>5} {'hit':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        per_1k = "-" if r.gpu_hours_per_1k_tokens is None else f"{r.gpu_hours_per_1k_tokens:.5f}"
        lines.append(
            f"{r.name:<22} {r.batch_size if r.batch_size is not None else '-':>4} "
            f"{r.slo_attainment:6.1%} {r.ttft_attainment:6.1%} {r.tpot_attainment:6.1%} "
            f"{r.e2e_attainment:6.1%} {_seconds(r.p99_ttft_s):>8} {_seconds(r.p99_tpot_s):>8} "
            f"{_seconds(r.p99_e2e_s):>8} {r.gpu_hours:7.2f} {per_1k:>8} {r.scale_events:5d} "
            f"{r.flips:5d} {r.max_queue:5d} {r.rejected:5d} {r.timeouts:5d} {r.dropped:5d} "
            f"{r.prefix_hit_rate:6.1%}"
        )
    return "\n".join(lines)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def plot_policy(result: PolicyResult, slos: Slos, path: Path) -> None:
    """One policy over time: load, replicas, batch, and the P99s it saw against the SLOs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ticks = result.timeline
    t = [tick.time_s / 60.0 for tick in ticks]
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    axes[0].plot(t, [tick.arrival_rate for tick in ticks], color="tab:gray", linewidth=0.8)
    axes[0].set_ylabel("arrivals (req/s)")
    axes[1].step(t, [tick.desired for tick in ticks], where="post", label="desired")
    axes[1].step(t, [tick.ready for tick in ticks], where="post", label="ready")
    axes[1].set_ylabel("replicas")
    axes[1].legend(loc="upper left")
    axes[2].step(t, [tick.batch for tick in ticks], where="post", color="tab:purple")
    axes[2].set_ylabel("batch cap")
    for label, values, slo, color in (
        ("TTFT", [tick.p99_ttft_s for tick in ticks], slos.ttft_s, "tab:blue"),
        ("TPOT", [tick.p99_tpot_s for tick in ticks], slos.tpot_s, "tab:orange"),
        ("E2E", [tick.p99_e2e_s for tick in ticks], slos.e2e_s, "tab:green"),
    ):
        axes[3].plot(t, [_nan(v) for v in values], color=color, label=f"P99 {label}")
        if slo is not None:
            axes[3].axhline(slo, color=color, linestyle=":", linewidth=1)
    axes[3].set_yscale("log")
    axes[3].set_ylabel("P99 seen (s)")
    axes[3].set_xlabel("time (min)")
    axes[3].legend(loc="upper left")
    fig.suptitle(
        f"{result.name}: {result.slo_attainment:.1%} of requests within every SLO, "
        f"{result.gpu_hours:.2f} GPU-hours"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_comparison(results: Sequence[PolicyResult], path: Path) -> None:
    """Every policy side by side: attainment, GPU-hours, and replicas over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in results]
    fig = plt.figure(figsize=(12, 9))
    grid = fig.add_gridspec(2, 2)
    ax = fig.add_subplot(grid[0, 0])
    ax.barh(names, [100 * r.slo_attainment for r in results], color="tab:blue")
    ax.set_xlabel("requests within every SLO (%)")
    ax.invert_yaxis()
    ax = fig.add_subplot(grid[0, 1])
    ax.barh(names, [r.gpu_hours for r in results], color="tab:gray")
    ax.set_xlabel("GPU-hours")
    ax.invert_yaxis()
    ax = fig.add_subplot(grid[1, :])
    for r in results:
        ax.step([k.time_s / 60.0 for k in r.timeline], [k.desired for k in r.timeline],
                where="post", label=r.name, linewidth=1)  # fmt: skip
    ax.set_xlabel("time (min)")
    ax.set_ylabel("replicas (desired)")
    ax.legend(loc="upper left", fontsize="small", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(results: Sequence[PolicyResult], slos: Slos, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for result in results:
        path = folder / f"simulate-{result.name}.png"
        plot_policy(result, slos, path)
        paths.append(path)
    path = folder / "simulate-comparison.png"
    plot_comparison(results, path)
    paths.append(path)
    return paths
