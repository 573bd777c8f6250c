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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wok_contracts.quantiles import nearest_rank
from wok_contracts.slos import Slos
from wok_sim.columns import COLUMNS
from wok_sim.fleet import FleetRun, Tick

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
    return nearest_rank(values) if values else None


def slo_hits(
    slos: Slos, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None
) -> tuple[bool, bool, bool]:
    """One request against the TTFT, TPOT and E2E SLOs. One that never had a first token or an
    end meets none; one of a single output token has no TPOT to miss."""
    if ttft_s is None or e2e_s is None:
        return (False, False, False)
    return (
        ttft_s <= slos.ttft_s,
        tpot_s is None or tpot_s <= slos.tpot_s,
        slos.e2e_s is None or e2e_s <= slos.e2e_s,
    )


def attainment(
    hits: Sequence[tuple[bool, bool, bool]], total: int
) -> tuple[float, float, float, float]:
    """The shares of `total` requests within TTFT, TPOT, E2E and all three. Every request counts
    in `total`; those with no entry in `hits` (rejected, timed out) are misses."""
    if not total:
        return (1.0, 1.0, 1.0, 1.0)
    counts = [sum(h[i] for h in hits) for i in range(3)] + [sum(all(h) for h in hits)]
    return (counts[0] / total, counts[1] / total, counts[2] / total, counts[3] / total)


def summarize(
    name: str, run: FleetRun, slos: Slos, *, batch_size: int | None = None
) -> PolicyResult:
    total = len(run.records)
    ok = [r for r in run.records if r.outcome == "ok"]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok]
    share = attainment([slo_hits(slos, r.ttft_s, r.tpot_s, r.e2e_s) for r in ok], total)
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


#: The rows the headline sentence speaks of: the law, the fixed fleet sized in hindsight, and the
#: HPA on the queue (the upstream autoscaler most teams would try first).
HEADLINE_FIXED = "static-peak"
HEADLINE_HPA = "hpa-waiting"


def _percent(share: float) -> str:
    return f"{100 * share:.1f} %"


def headline(results: Sequence[PolicyResult], *, target: float) -> str:
    """One sentence a newcomer can read before the table: what the first policy (wok, in the
    default run) served on how many GPU-hours, what the cheapest fixed fleet reaching `target`
    needed, and what the HPA on the queue served. A row the run lacks is left out; a fixed fleet
    that never reached `target` is said to, with its best."""
    by_name = {r.name: r for r in results}
    first = results[0]
    goal = f"{100 * target:g} %"
    parts = [
        f"{first.name} served {_percent(first.slo_attainment)} of requests within every SLO "
        f"on {first.gpu_hours:.2f} GPU-hours"
    ]
    fixed = by_name.get(HEADLINE_FIXED)
    if fixed is not None and fixed is not first:
        pods = max((tick.desired for tick in fixed.timeline), default=0)
        batch = "" if fixed.batch_size is None else f" at batch {fixed.batch_size}"
        if fixed.slo_attainment >= target:
            parts.append(
                f"the cheapest fixed fleet that reaches {goal} ({HEADLINE_FIXED}) "
                f"needs {pods} pod{'s' * (pods != 1)}{batch}, {fixed.gpu_hours:.2f} GPU-hours, "
                f"for {_percent(fixed.slo_attainment)}"
            )
        else:
            parts.append(
                f"no fixed fleet tried reaches {goal} ({HEADLINE_FIXED}'s best: "
                f"{pods} pod{'s' * (pods != 1)}{batch}, {_percent(fixed.slo_attainment)})"
            )
    hpa = by_name.get(HEADLINE_HPA)
    if hpa is not None and hpa is not first:
        parts.append(
            f"the HPA on the queue ({HEADLINE_HPA}) served {_percent(hpa.slo_attainment)} "
            f"on {hpa.gpu_hours:.2f} GPU-hours"
        )
    return "; ".join(parts) + "."


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _cells(r: PolicyResult) -> list[str]:
    per_1k = "-" if r.gpu_hours_per_1k_tokens is None else f"{r.gpu_hours_per_1k_tokens:.5f}"
    return [
        r.name,
        "-" if r.batch_size is None else str(r.batch_size),
        f"{r.slo_attainment:.1%}",
        f"{r.ttft_attainment:.1%}",
        f"{r.tpot_attainment:.1%}",
        f"{r.e2e_attainment:.1%}",
        _seconds(r.p99_ttft_s),
        _seconds(r.p99_tpot_s),
        _seconds(r.p99_e2e_s),
        f"{r.gpu_hours:.2f}",
        per_1k,
        *(str(n) for n in (r.scale_events, r.flips, r.max_queue, r.rejected, r.timeouts)),
        str(r.dropped),
        f"{r.prefix_hit_rate:.1%}",
    ]


def table(results: Sequence[PolicyResult]) -> str:
    """One row a policy, each column as wide as its widest cell: names left, figures right."""
    rows = [[header for header, _ in COLUMNS], *(_cells(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

    def line(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        return "  ".join(
            [first, *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))]
        )

    lines = [line(row) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


#: Arrivals are counted in bins of this width for every plot of a run, so that the same trace
#: draws the same curve under every policy (per control tick, each policy's own interval set the
#: bins and the peaks differed).
ARRIVAL_BIN_S = 10.0


def arrival_rates(
    arrivals_s: Sequence[float], bin_s: float = ARRIVAL_BIN_S
) -> tuple[list[float], list[float]]:
    """Arrivals as requests/s per fixed bin: each bin's start (s) and its rate."""
    if not arrivals_s:
        return [], []
    counts = [0] * (int(max(arrivals_s) // bin_s) + 1)
    for t in arrivals_s:
        counts[int(t // bin_s)] += 1
    return [i * bin_s for i in range(len(counts))], [n / bin_s for n in counts]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_ticks(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def policy_figure(result: PolicyResult, slos: Slos, arrivals_s: Sequence[float]) -> Figure:
    """One policy over time: the trace's arrivals, replicas, batch, and the P99s it saw against
    the SLOs (dotted, in the legend)."""
    ticks = result.timeline
    t = [tick.time_s / 60.0 for tick in ticks]
    fig, axes = _pyplot().subplots(4, 1, figsize=(11, 10), sharex=True)
    starts, rates = arrival_rates(arrivals_s)
    axes[0].step([s / 60.0 for s in starts], rates, where="post", color="tab:gray", linewidth=0.8)
    axes[0].set_ylabel(f"arrivals (req/s, {ARRIVAL_BIN_S:g} s bins)")
    axes[1].step(t, [tick.desired for tick in ticks], where="post", label="desired")
    axes[1].step(t, [tick.ready for tick in ticks], where="post", label="ready")
    axes[1].set_ylabel("replicas")
    axes[1].set_ylim(bottom=0)
    _integer_ticks(axes[1].yaxis)
    axes[1].legend(loc="upper left")
    axes[2].step(t, [tick.batch for tick in ticks], where="post", color="tab:purple")
    axes[2].set_ylabel("batch cap")
    _integer_ticks(axes[2].yaxis)
    for label, values, slo, color in (
        ("TTFT", [tick.p99_ttft_s for tick in ticks], slos.ttft_s, "tab:blue"),
        ("TPOT", [tick.p99_tpot_s for tick in ticks], slos.tpot_s, "tab:orange"),
        ("E2E", [tick.p99_e2e_s for tick in ticks], slos.e2e_s, "tab:green"),
    ):
        axes[3].plot(t, [_nan(v) for v in values], color=color, label=f"P99 {label}")
        if slo is not None:
            axes[3].axhline(
                slo, color=color, linestyle=":", linewidth=1, label=f"{label} SLO ({slo:g} s)"
            )
    axes[3].set_yscale("log")
    axes[3].set_ylabel("P99 seen (s)")
    axes[3].set_xlabel("time (min)")
    axes[3].legend(loc="upper left", ncol=2, fontsize="small")
    fig.suptitle(
        f"{result.name}: {result.slo_attainment:.1%} of requests within every SLO, "
        f"{result.gpu_hours:.2f} GPU-hours"
    )
    fig.tight_layout()
    return fig


def comparison_figure(results: Sequence[PolicyResult]) -> Figure:
    """Every policy side by side: attainment, GPU-hours, and replicas over time. The replica
    axis is logarithmic (base 2, integer ticks), so that `ceiling` at 32 pods leaves the others'
    few pods readable."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    names = [r.name for r in results]
    fig = _pyplot().figure(figsize=(12, 9))
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
        ax.step([k.time_s / 60.0 for k in r.timeline], [max(k.desired, 1) for k in r.timeline],
                where="post", label=r.name, linewidth=1)  # fmt: skip
    top = max((k.desired for r in results for k in r.timeline), default=1)
    ax.set_yscale("log", base=2)
    powers = range(math.ceil(math.log2(max(top, 1))) + 1)
    ax.yaxis.set_major_locator(FixedLocator([2**i for i in powers]))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("time (min)")
    ax.set_ylabel("replicas (desired, log scale)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.suptitle(f"{len(results)} policies on the same arrivals")
    fig.tight_layout()
    return fig


def write_ticks(results: Sequence[PolicyResult], folder: Path) -> list[Path]:
    """Each policy's control ticks, one JSON object a line: where a policy lost, its reasons say
    which rule acted and when."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for result in results:
        path = folder / f"ticks-{result.name}.jsonl"
        path.write_text("".join(json.dumps(asdict(tick)) + "\n" for tick in result.timeline))
        paths.append(path)
    return paths


def write_plots(
    results: Sequence[PolicyResult], slos: Slos, folder: Path, *, arrivals_s: Sequence[float]
) -> list[Path]:
    """One plot a policy, and a comparison when there is more than one policy to compare."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for result in results:
        paths.append(
            save(policy_figure(result, slos, arrivals_s), folder / f"simulate-{result.name}.png")
        )
    if len(results) > 1:
        paths.append(save(comparison_figure(results), folder / "simulate-comparison.png"))
    return paths


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path
