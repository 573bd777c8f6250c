"""The law over a day: wok against static-peak, the static frontier and swept HPA / KEDA on the
ServeGen day (bench/traces/servegen_m_large.json at its default day and rate scale, or `--scale`
times that rate).

The conditions are `wok evaluate`'s (`Condition("day", scale, 90 s, loose)`: TTFT 2 s, TPOT 0.1 s,
scored from its warm-up, the planner's warm start for the autoscalers, static fleets at full size)
and so are the frontier and static-peak (`wok_sim.evaluation_analysis`'s pure functions). A day
is 24 times an hour-long trace's simulations, so this runs a chosen subset of `wok evaluate`'s
matrix: wok on the seeds asked, the static fleets around the peak at the B the hour-long
frontiers chose (32 and 64) on the first seed and those that make the frontier near wok on every
seed (the frontier and static-peak are means over wok's seeds, as in `wok evaluate`), and the
swept baselines' targets that came nearest wok on the hour-long traces, on the first seed. It
also keeps what the summary hides: per hour, the load, the pods and the attainment of wok and
static-peak.

    python bench/autoscaling/daytrace.py --seeds 0,1,2,3,4 --jobs 1  # the jobs not in the JSON
    python bench/autoscaling/daytrace.py --render                    # the table and plot again
    python bench/autoscaling/daytrace.py --scale 3 --seeds 0 --jobs 1  # 3 x the rate

Writes bench/autoscaling/results/daytrace.{md,json,png} (daytrace_x{scale}.* at another
`--scale`); each finished simulation is saved at once, so a run that is stopped keeps what it
did and the next run goes on from there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from wok_sim.evaluation_analysis import Point, frontier, frontier_at, points, static_peak
from wok_sim.evaluation_matrix import STATIC, WARM_UP_S, Condition, Job, Outcome, variants_of
from wok_sim.evaluation_runner import job_setup

# At ×1, in the order they run (a stopped run keeps the first): the fleets around the planner's
# peak (3 pods) at B64, then the nearest rivals, then the same fleets at B32.
STATICS = ((4, 64), (3, 64), (5, 64), (2, 64), (4, 32), (3, 32), (5, 32))
# The fleets on each side of wok's GPU-hours (static-peak and the one below) at the B that serve
# most: run on every seed, since the frontier there is what wok is judged against.
SEEDED_STATICS = ((3, 64), (2, 64), (3, 32))
PEAK_PODS = 3  # the planner's peak fleet at ×1; another scale looks around PEAK_PODS × scale
# (registry name, variant name, B): the targets nearest wok on the hour-long code trace.
BASELINES = (
    ("hpa-concurrency-swept", "hpa-concurrency-4", 64),
    ("keda-waiting-swept", "keda-waiting-5", 64),
    ("hpa-concurrency-swept", "hpa-concurrency-2", 32),
    ("hpa-concurrency-swept", "hpa-concurrency-8", 64),
    ("keda-waiting-swept", "keda-waiting-20", 64),
)
# The field's autoscalers (their `-swept` registry entries) over their targets at B64, the B
# the day's frontier chose: AIBrix on the waiting queue only (on KV usage they do not scale up
# on these loads, bench/autoscaling/results/field_ports.md), Dynamo's planner and WVA at each
# target scale.
# A day's simulation is minutes on the shared machine: one target of each first, in this order.
FIELD = tuple(
    (registry, f"{prefix}{target}", 64)
    for targets in (
        ("5", "1", "1"),
        ("20", "0.6", "0.6"),
        ("2", "0.2", "0.2"),
        ("100", "0.4", "0.4"),
    )
    for registry, prefix, target in zip(
        ("aibrix-apa-swept", "aibrix-kpa-swept", "dynamo-planner-swept", "wva-swept"),
        ("aibrix-apa-waiting-", "aibrix-kpa-waiting-", "dynamo-planner-", "wva-"),
        (targets[0], targets[0], targets[1], targets[2]),
        strict=True,
    )
)
HOUR_S = 3600.0
RESULTS = Path(__file__).resolve().parent / "results"
GOAL_ATTAINMENT, GOAL_SHARE = 0.99, 0.70
Fleet = tuple[int, int]  # (replicas, B)


def condition(scale: float) -> Condition:
    return Condition("day", scale, 90.0, "loose")


def static_fleets(scale: float) -> tuple[tuple[Fleet, ...], tuple[Fleet, ...]]:
    """(every static fleet run on the first seed, in the order they run; those run on each seed).

    ×1 keeps the fleets its published results ran. Elsewhere, from p = round(PEAK_PODS × scale)
    down: B32 first (a fifth of B64's simulator time) at p to p-3, since a larger fleet batches
    more and its peak grows less than the rate (and wok's GPU-hours lie below it), then B64 at
    p-2, p-3 and p-1, where B32 may just miss 99 % (static-peak is the cheapest fleet at any B)
    or B64 may lift the frontier, then B32 at p+1. The seeded ones: static-peak's likely fleets
    and those on each side of wok's GPU-hours.
    """
    if scale == 1.0:
        return STATICS, SEEDED_STATICS
    p = round(PEAK_PODS * scale)
    statics = (
        (p, 32),
        (p - 1, 32),
        (p - 2, 32),
        (p - 3, 32),
        (p - 2, 64),
        (p - 3, 64),
        (p - 1, 64),
        (p + 1, 32),
    )
    seeded = ((p - 2, 64), (p - 3, 64), (p - 1, 32), (p - 2, 32), (p - 3, 32))
    return tuple(f for f in statics if f[0] >= 1), tuple(f for f in seeded if f[0] >= 1)


def static_jobs(seeds: list[int], scale: float = 1.0) -> list[Job]:
    """Every fleet of static_fleets' first list on the first seed, then the seeded ones on each
    other seed, seed by seed (a stopped run leaves whole seeds)."""
    statics, seeded = static_fleets(scale)
    first, *others = seeds
    fleets = [(first, *f) for f in statics] + [(s, *f) for s in others for f in seeded]
    return [Job(condition(scale), seed, STATIC, n * 1000 + b) for seed, n, b in fleets]


def jobs(seeds: list[int], scale: float = 1.0, rival_seeds: Sequence[int] = ()) -> list[Job]:
    """wok on the first seed, the first three static fleets, two rivals, the other static
    fleets; then seed by seed wok and the static fleets near it (a stopped run leaves whole seeds
    to compare); last the other rivals, then every rival on each of `rival_seeds`."""
    cond = condition(scale)
    statics = static_jobs(seeds, scale)
    first = statics[: len(static_fleets(scale)[0])]
    rivals = [
        Job(cond, seeds[0], registry, variants_of(registry, cond, seeds[0]).index((name, b)))
        for registry, name, b in (*BASELINES, *FIELD)
    ]
    wok = [Job(cond, seed, "wok", 0) for seed in seeds]
    later = [
        job
        for seed, w in zip(seeds[1:], wok[1:], strict=True)
        for job in (w, *(j for j in statics if j.seed == seed))
    ]
    again = [Job(cond, seed, r.policy, r.variant) for seed in rival_seeds for r in rivals]
    return [*wok[:1], *first[:3], *rivals[:2], *first[3:], *later, *rivals[2:], *again]


def key(job: Job) -> str:
    return f"{job.policy}/{job.variant}/{job.seed}"


def run_job(job: Job) -> dict:
    """One simulation: evaluate's scoring, plus per hour the arrivals, the attainment of the
    requests that arrived in it, and the mean ready and pending pods."""
    from wok_contracts.slos import Slos
    from wok_sim.fleet import simulate_fleet
    from wok_sim.report import slo_hits, summarize

    setup = job_setup(job)
    ctx, policy = setup.context, setup.policy
    started = time.perf_counter()
    run = simulate_fleet(list(ctx.requests), policy, setup.config)
    slos = Slos(ctx.slo_ttft_s, ctx.slo_tpot_s)
    result = summarize(policy.name, run, slos)
    hours = int(max(r.arrival_s for r in ctx.requests) // HOUR_S) + 1
    arrived, met = [0] * hours, [0] * hours
    for r in run.records:
        h = int(r.arrival_s // HOUR_S)
        arrived[h] += 1
        met[h] += r.outcome == "ok" and all(slo_hits(slos, r.ttft_s, r.tpot_s, r.e2e_s))
    ticks: list[list[tuple[int, int]]] = [[] for _ in range(hours)]
    for tick in run.timeline:
        ticks[min(int(tick.time_s // HOUR_S), hours - 1)].append((tick.ready, tick.pending))
    return {
        "key": key(job),
        "policy": job.policy,
        "variant": job.variant,
        "seed": job.seed,
        "name": policy.name,
        "batch": policy.fixed_batch,
        "attainment": round(result.slo_attainment, 6),
        "gpu_hours": round(result.gpu_hours, 4),
        "requests": result.requests,
        "steps": run.steps,
        "sim_s": round(time.perf_counter() - started, 1),
        "hourly": [
            {
                "arrived": arrived[h],
                "met": met[h],
                "ready": round(statistics.fmean(t[0] for t in ticks[h]), 3) if ticks[h] else 0,
                "pending": round(statistics.fmean(t[1] for t in ticks[h]), 3) if ticks[h] else 0,
            }
            for h in range(hours)
        ],
    }


def outcome(run: dict, scale: float) -> Outcome:
    job = Job(condition(scale), run["seed"], run["policy"], run["variant"])
    return Outcome(job, run["name"], run["batch"], run["attainment"], run["gpu_hours"], 0.0)


def summary(runs: list[dict], scale: float = 1.0) -> dict:
    """wok's mean over its seeds against the static frontier, static-peak and the baselines; the
    static fleets count only the seeds wok ran (the same seeds, as in `wok evaluate`)."""
    outcomes = [outcome(r, scale) for r in runs]
    wok_seeds = {o.job.seed for o in outcomes if o.job.policy == "wok"}
    statics = points(
        o for o in outcomes if o.job.policy == STATIC and (not wok_seeds or o.job.seed in wok_seeds)
    )
    front = frontier(statics)
    wok = points(o for o in outcomes if o.job.policy == "wok")
    rivals = points(o for o in outcomes if o.job.policy not in (STATIC, "wok"))
    peak = static_peak(front)
    out: dict = {
        "statics": statics,
        "frontier": front,
        "static_peak": peak,
        "wok": None,
        "rivals": rivals,
    }
    if wok:
        w = wok[0]
        share = w.gpu_hours / peak.gpu_hours if peak else None
        reaching = [r for r in rivals if r.attainment >= w.attainment]
        out.update(
            wok=w,
            frontier_there=frontier_at(front, w.gpu_hours) if front else None,
            share_of_peak=share,
            goal=share is not None and w.attainment >= GOAL_ATTAINMENT and share <= GOAL_SHARE,
            cheapest_rival=min(reaching, key=lambda r: r.gpu_hours, default=None),
        )
    return out


def _order(p: Point) -> tuple[float, int]:
    return (p.gpu_hours, -(p.batch or 0))


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _title(scale: float) -> str:
    return "the ServeGen m-large day" + ("" if scale == 1.0 else f" ×{scale:g}")


def _rate(scale: float) -> str:
    """The load, in the words of the trace's defaults and `scale_rate`'s overlay."""
    if scale == 1.0:
        return "rate scale 0.1"
    return (
        f"rate scale 0.1, then ×{scale:g} (`wok evaluate`'s overlay: each request and "
        f"{scale - 1:g} copies on average, each moved by a seeded ±30 s jitter)"
    )


def markdown(runs: list[dict], command: str, scale: float = 1.0) -> str:
    s = summary(runs, scale)
    w, peak = s["wok"], s["static_peak"]
    lines = [
        f"# The law over a day: {_title(scale)}",
        "",
        f"Command: `{command}`",
        "",
        "Trace: bench/traces/servegen_m_large.json at its defaults (day 6, 24 h from midnight, "
        f"{_rate(scale)}; arrivals drawn from ServeGen's per-window fits with each seed), profile "
        "`sim:llama-3-8b-80g`, 90 s pod start, TTFT 2 s and TPOT 0.1 s (`wok evaluate`'s loose "
        f"SLOs), every policy scored from {WARM_UP_S:g} s. Mean [min–max] over the seeds; a "
        "static fleet counts only the seeds wok ran. The static fleets near wok's GPU-hours run "
        "on wok's seeds, the others and the baselines on the first seed (B and target chosen in "
        "hindsight). Simulator wall time: the slowest seed's (`sim_s` in the JSON).",
        "",
        "| policy | seeds | all SLOs % [range] | GPU-h [range] | requests | sim wall s |",
        "|---|---|---|---|---|---|",
    ]
    for p in [*([w] if w else []), *sorted(s["statics"], key=_order), *s["rivals"]]:
        mine = [r for r in runs if (r["name"], r["batch"]) == (p.name, p.batch)]
        lo, hi = p.attainment_range
        glo, ghi = p.gpu_hours_range
        label = "**wok**" if p is w else f"{p.name} B{p.batch}"
        label += " (static-peak)" if p is peak else ""
        lines.append(
            f"| {label} | {p.seeds} | {_pct(p.attainment)} [{_pct(lo)}–{_pct(hi)}] "
            f"| {p.gpu_hours:.2f} [{glo:.2f}–{ghi:.2f}] | {max(r['requests'] for r in mine):,} "
            f"| {max(r['sim_s'] for r in mine):.0f} |"
        )
    lines += ["", "## Against static-peak", ""]
    if not w or not peak:
        lines.append("Not judged: wok or a static fleet reaching 99 % has not run yet.")
    else:
        rival = s["cheapest_rival"]
        lines += [
            f"- static-peak (the cheapest static fleet at ≥ 99 %): {peak.name} B{peak.batch}, "
            f"{_pct(peak.attainment)} % at {peak.gpu_hours:.2f} GPU-h (seeds: {peak.seeds}).",
            f"- wok (seeds: {w.seeds}): {_pct(w.attainment)} % at {w.gpu_hours:.2f} GPU-h, "
            f"{100 * s['share_of_peak']:.0f} % of static-peak's; the static frontier at wok's "
            + (
                f"GPU-h: {_pct(s['frontier_there'])} %."
                if any(p.gpu_hours <= w.gpu_hours for p in s["frontier"])
                else "GPU-h: below every static fleet run."
            ),
            "- The former goal, ≥ 99 % at ≤ 70 % of static-peak's GPU-hours: "
            f"{'met' if s['goal'] else 'not met'}. The day's reference is now the hindsight "
            "hourly fleet (hourly_fleet.md: the fewest pods each hour, switched on the hour).",
            "- Cheapest baseline run at or above wok's attainment: "
            + (
                f"{rival.name} B{rival.batch}, {_pct(rival.attainment)} % at "
                f"{rival.gpu_hours:.2f} GPU-h."
                if rival
                else "none of those run."
            ),
        ]
    lines += ["", "## Hour by hour (seed 0: wok and static-peak)", ""]
    wok0, peak_run = seed_zero_runs(runs, peak)
    if wok0:
        lines += [
            "| hour | arrivals/s | wok ready pods | wok pending | wok all SLOs % "
            "| static-peak all SLOs % |",
            "|---|---|---|---|---|---|",
        ]
        for h, row in enumerate(wok0["hourly"]):
            p = peak_run["hourly"][h] if peak_run else None
            lines.append(
                f"| {h:02d}:00 | {row['arrived'] / HOUR_S:.1f} | {row['ready']:.2f} "
                f"| {row['pending']:.2f} | {_pct(row['met'] / max(1, row['arrived']))} "
                f"| {_pct(p['met'] / max(1, p['arrived'])) if p else '-'} |"
            )
    return "\n".join(lines) + "\n"


def seed_zero_runs(runs: list[dict], peak: Outcome | None) -> tuple[dict | None, dict | None]:
    """wok's and static-peak's runs on seed 0, whose hours the table and the plot show."""
    wok0 = next((r for r in runs if r["key"] == "wok/0/0"), None)
    peak_run = next(
        (
            r
            for r in runs
            if peak and r["seed"] == 0 and (r["name"], r["batch"]) == (peak.name, peak.batch)
        ),
        None,
    )
    return wok0, peak_run


def plot(runs: list[dict], path: Path, scale: float = 1.0) -> None:
    """Load, pods and attainment per hour: wok against static-peak, seed 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peak = summary(runs, scale)["static_peak"]
    wok0, peak_run = seed_zero_runs(runs, peak)
    if not wok0:
        return
    hours = list(range(len(wok0["hourly"])))
    fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    axes[0].bar(hours, [r["arrived"] / HOUR_S for r in wok0["hourly"]], color="tab:gray")
    axes[0].set_ylabel("arrivals/s")
    axes[1].step(hours, [r["ready"] for r in wok0["hourly"]], where="mid", label="wok ready")
    axes[1].step(
        hours,
        [r["ready"] + r["pending"] for r in wok0["hourly"]],
        where="mid",
        linestyle=":",
        label="wok ready + pending",
    )
    if peak_run:
        replicas = int(peak.name.removeprefix("static-"))
        axes[1].axhline(replicas, color="k", linestyle="--", label=f"{peak.name} (static-peak)")
    axes[1].set_ylim(bottom=0)
    axes[1].set_ylabel("pods (hourly mean)")
    axes[1].legend(fontsize="small")
    for run, label in ((wok0, "wok"), (peak_run, "static-peak")):
        if run:
            axes[2].plot(
                hours,
                [100 * r["met"] / max(1, r["arrived"]) for r in run["hourly"]],
                marker=".",
                label=label,
            )
    axes[2].axhline(99, color="tab:red", linewidth=0.8, linestyle="--")
    axes[2].set_ylabel("all SLOs % (by arrival hour)")
    axes[2].set_xlabel("hour of the day")
    axes[2].legend(fontsize="small")
    fig.suptitle(
        f"{_title(scale).removeprefix('the ')}, 90 s pod start, TTFT 2 s / TPOT 0.1 s",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(runs: list[dict], command: str, out: Path, scale: float) -> None:
    stored: dict = {"command": command, "runs": runs} | ({} if scale == 1.0 else {"scale": scale})
    out.write_text(json.dumps(stored, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(runs, command, scale))
    plot(runs, out.with_suffix(".png"), scale)


def default_out(scale: float) -> Path:
    return RESULTS / ("daytrace.json" if scale == 1.0 else f"daytrace_x{scale:g}.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0", help="wok's seeds, comma-separated")
    parser.add_argument("--jobs", type=int, default=2, help="parallel simulations")
    parser.add_argument(
        "--only", default="", help="PREFIX[,PREFIX…]: run the jobs whose key starts with one"
    )
    parser.add_argument(
        "--rival-seeds", default="", help="SEED[,SEED…]: run the rivals on these seeds too"
    )
    parser.add_argument("--render", action="store_true", help="no simulation: rewrite from JSON")
    parser.add_argument("--scale", type=float, default=1.0, help="the day's rate ×, ≥ 1")
    parser.add_argument(
        "--out", type=Path, help="the JSON (and .md, .png beside it); default daytrace[_xSCALE]"
    )
    args = parser.parse_args()
    out = args.out or default_out(args.scale)
    stored = json.loads(out.read_text()) if out.is_file() else {"runs": []}
    runs: list[dict] = stored["runs"]
    command = "nice -n 19 .venv/bin/python bench/autoscaling/daytrace.py " + " ".join(sys.argv[1:])
    if args.render:
        write(runs, stored.get("command", command), out, stored.get("scale", args.scale))
        print(out.with_suffix(".md").read_text())
        return 0
    done = {r["key"] for r in runs}
    todo = [
        j
        for j in jobs(
            [int(s) for s in args.seeds.split(",")],
            args.scale,
            [int(s) for s in args.rival_seeds.split(",") if s],
        )
        if key(j) not in done and key(j).startswith(tuple(args.only.split(",")))
    ]
    print(f"{len(todo)} simulations to run", file=sys.stderr)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for future in as_completed([pool.submit(run_job, j) for j in todo]):
            run = future.result()
            runs.append(run)
            write(runs, command, out, args.scale)
            print(
                f"{run['key']}: {run['name']} B{run['batch']} {_pct(run['attainment'])} % at "
                f"{run['gpu_hours']:.2f} GPU-h ({run['sim_s']:.0f} s)",
                file=sys.stderr,
            )
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
