"""wok over the ServeGen day against the hindsight hourly fleet: what a perfect schedule-based
operator would spend.

The hourly fleet (`wok_sim.hourly_fleet`) holds, in each hour, the fewest whole pods at B64
that serve that hour's requests at ≥ 99 % within the SLOs, given the hours before; it switches on
the hour, and every pod it adds pays the 90 s pod start (pending, billed from its creation).
Each hour is searched on a window of the day (5 minutes of the previous hour's fleet before it,
2 minutes of the next hour's arrivals after it); the chosen schedule then runs over the whole day
once, and where that day serves an hour under 99 % that its window served at 99 % (the window's
warm-up is not the day's state), that hour gets one pod more and the day runs again; the last
day's attainment and GPU-hours are the ones reported (each hour's attainment in its window and
in the first day are kept side by side). wok runs with its defaults on the same seeds
(`bench/autoscaling/daytrace.py`'s simulation). The conditions are the day's
(`daytrace.condition`: 90 s pod start, TTFT 2 s, TPOT 0.1 s, scored from 300 s).

    python bench/autoscaling/hourly_fleet.py --scales 1,3 --seeds 0,1,2,3,4 --jobs 2
    python bench/autoscaling/hourly_fleet.py --render      # the table and plot again

Writes bench/autoscaling/results/hourly_fleet.{md,json,png}; each finished simulation is saved
at once, so a stopped run keeps what it did and the next run goes on from there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from daytrace import condition
from daytrace import run_job as run_daytrace_job
from tqdm import tqdm

from wok_contracts.slos import Slos
from wok_sim.evaluation_matrix import WARM_UP_S, Job, context
from wok_sim.fleet import FleetConfig, FleetRun
from wok_sim.hourly_fleet import (
    HOUR_S,
    HourDecision,
    HourFleet,
    HourlySearch,
    hourly_rows,
    hours_of,
)
from wok_sim.report import summarize

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "hourly_fleet.json"
HOURLY, WOK = "hourly", "wok"
GOAL_ATTAINMENT, GOAL_SHARE = 0.99, 1.05


def key(policy: str, scale: float, seed: int) -> str:
    return f"{policy}/x{scale:g}/{seed}"


def run_wok(scale: float, seed: int) -> dict:
    run = run_daytrace_job(Job(condition(scale), seed, "wok", 0))
    return run | {"key": key(WOK, scale, seed), "scale": scale}


def day_search(scale: float, seed: int) -> HourlySearch:
    cond = condition(scale)
    ctx = context(cond, seed, warm_start_fleet=False)
    config = FleetConfig(
        profile=ctx.profile, cold_start_s=cond.cold_start_s, seed=seed, score_from_s=WARM_UP_S
    )
    return HourlySearch(
        ctx.requests, config, Slos(ctx.slo_ttft_s, ctx.slo_tpot_s), ctx.max_replicas
    )


def day_figures(search: HourlySearch, run: FleetRun) -> dict:
    result = summarize("hourly-fleet", run, search.slos)
    return {
        "attainment": round(result.slo_attainment, 6),
        "gpu_hours": round(result.gpu_hours, 4),
        "requests": result.requests,
        "sim_s": round(run.wall_seconds, 1),
    }


def run_hourly(scale: float, seed: int) -> dict:
    """The hourly fleet's search, then its schedule over the whole day, settled."""
    search = day_search(scale, seed)
    started = time.perf_counter()

    def told(hour: int, decision: HourDecision) -> None:
        fleet = decision.fleet
        print(
            f"  ×{scale:g} seed {seed} {hour:02d}:00: {fleet.replicas} pods B{fleet.batch}",
            file=sys.stderr,
            flush=True,
        )

    decisions = search.day(told)
    search_s = time.perf_counter() - started
    run = search.run_day([d.fleet for d in decisions])
    rows = hourly_rows(run, search.slos, hours_of(search.requests))
    for row, d in zip(rows, decisions, strict=True):
        row |= {
            "replicas": d.fleet.replicas,
            "batch": d.fleet.batch,
            "window": round(d.probes[d.fleet], 6),
            "probes": [[f.replicas, f.batch, round(a, 6)] for f, a in d.probes.items()],
        }
    searched = {
        "key": key(HOURLY, scale, seed),
        "policy": HOURLY,
        "scale": scale,
        "seed": seed,
        **day_figures(search, run),
        "search_s": round(search_s, 1),
        "hourly": rows,
    }
    return settled(searched, search)


def _share(row: dict) -> float:
    return row["met"] / row["arrived"] if row["arrived"] else 1.0


def settled(searched: dict, search: HourlySearch | None = None) -> dict:
    """A searched hourly fleet after `HourlySearch.settle`: one pod more in each hour that the
    whole day served under 99 % (`added`), and the day's figures from its last run. Each hour
    keeps its attainment in the first whole day (`day_searched`) beside its window's."""
    search = search or day_search(searched["scale"], searched["seed"])
    rows = [r | {"day_searched": round(_share(r), 6)} for r in searched["hourly"]]
    fleets = [HourFleet(r["replicas"], r["batch"]) for r in rows]
    final, run = search.settle(fleets, [_share(r) for r in rows], [r["window"] for r in rows])
    if run is None:
        return searched | {"hourly": rows, "added": []}
    fresh = hourly_rows(run, search.slos, len(rows))
    return searched | {
        **day_figures(search, run),
        "added": [h for h, (a, b) in enumerate(zip(fleets, final, strict=True)) if a != b],
        "hourly": [
            old | new | {"replicas": f.replicas}
            for old, new, f in zip(rows, fresh, final, strict=True)
        ],
    }


def runs_from(path: Path, runs: list[dict]) -> list[dict]:
    """`runs` with those of another JSON: wok's runs of a `bench/autoscaling/daytrace.py` JSON
    (the same simulation, `daytrace.run_job`), keyed as this script keys them, and any run of
    another of this script's JSONs. A run already there stays, unless the other is the settled
    hourly fleet of the same day and it is not."""
    stored = json.loads(path.read_text())
    by_key = {r["key"]: r for r in runs}
    for r in stored["runs"]:
        if "scale" not in r:  # bench/autoscaling/daytrace.py's, whose scale is the file's
            if r["policy"] != WOK:
                continue
            scale = stored.get("scale", 1.0)
            r = r | {"key": key(WOK, scale, r["seed"]), "scale": scale}
        mine = by_key.get(r["key"])
        if mine is None or ("added" in r and "added" not in mine):
            by_key[r["key"]] = r
    return list(by_key.values())


def run_one(policy: str, scale: float, seed: int) -> dict:
    return (run_hourly if policy == HOURLY else run_wok)(scale, seed)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def pairs(runs: list[dict], scale: float) -> list[tuple[dict, dict]]:
    """(hourly fleet, wok) for each seed at `scale` where both ran, by seed."""
    by_key = {r["key"]: r for r in runs}
    seeds = sorted({r["seed"] for r in runs if r["scale"] == scale})
    return [
        (by_key[key(HOURLY, scale, s)], by_key[key(WOK, scale, s)])
        for s in seeds
        if key(HOURLY, scale, s) in by_key and key(WOK, scale, s) in by_key
    ]


def share(hourly: dict, wok: dict) -> float:
    return wok["gpu_hours"] / hourly["gpu_hours"]


def window_gap(run: dict) -> tuple[float, int, list[int]]:
    """The largest difference, in points, between an hour's attainment in its search window and
    in the first whole day on the searched schedule; the hours that day served under 99 %; the
    hours given a pod more for them (`settled`)."""
    gaps, under = [], 0
    for row in run["hourly"]:
        day = row.get("day_searched", row["met"] / max(1, row["arrived"]))
        gaps.append(abs(row["window"] - day))
        under += day < GOAL_ATTAINMENT
    return 100 * max(gaps), under, run.get("added", [])


def markdown(runs: list[dict], command: str) -> str:
    lines = [
        "# The day against the hindsight hourly fleet",
        "",
        f"Command: `{command}`",
        "",
        "Trace: bench/traces/servegen_m_large.json at its defaults (day 6, 24 h from midnight, "
        "rate scale 0.1, ×3: `wok evaluate`'s overlay), profile `sim:llama-3-8b-80g`, 90 s pod "
        f"start, TTFT 2 s and TPOT 0.1 s, every policy scored from {WARM_UP_S:g} s. The hourly "
        "fleet: in each hour the fewest whole pods at B64 that serve the requests arriving in "
        "it at ≥ 99 % within every SLO, given the hours before (searched hour by hour on a "
        "window of the day, by bisection); switched on the hour, added pods pending for the pod "
        "start and billed from their creation, removed pods draining. Its figures are those of "
        "a whole-day simulation of the chosen schedule (where the first served an hour under "
        "99 %, with one pod more in that hour, run again). wok: its defaults "
        "(`bench/autoscaling/daytrace.py`'s simulation).",
        "",
    ]
    for scale in sorted({r["scale"] for r in runs}):
        lines += scale_section(runs, scale)
    return "\n".join(lines) + "\n"


def scale_section(runs: list[dict], scale: float) -> list[str]:
    """One scale's table: each seed's hourly fleet and wok, their means against the goal, the
    search's windows against the whole day, and seed 0's day hour by hour."""
    both = pairs(runs, scale)
    lines = [
        f"## ×{scale:g}",
        "",
        "| seed | hourly fleet all SLOs % | hourly fleet GPU-h | wok all SLOs % | wok GPU-h "
        "| wok ÷ hourly fleet GPU-h | search wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for h, w in both:
        lines.append(
            f"| {h['seed']} | {_pct(h['attainment'])} | {h['gpu_hours']:.2f} "
            f"| {_pct(w['attainment'])} | {w['gpu_hours']:.2f} | {100 * share(h, w):.1f} % "
            f"| {h['search_s']:.0f} |"
        )
    if not both:
        return [*lines, "", "No seed with both runs yet.", ""]
    hourly_att = statistics.fmean(h["attainment"] for h, _ in both)
    hourly_gpu = statistics.fmean(h["gpu_hours"] for h, _ in both)
    wok_att = statistics.fmean(w["attainment"] for _, w in both)
    wok_gpu = statistics.fmean(w["gpu_hours"] for _, w in both)
    ratio = wok_gpu / hourly_gpu
    met = wok_att >= GOAL_ATTAINMENT and ratio <= GOAL_SHARE
    lines += [
        f"| **mean of {len(both)}** | {_pct(hourly_att)} | {hourly_gpu:.2f} "
        f"| {_pct(wok_att)} | {wok_gpu:.2f} | {100 * ratio:.1f} % | |",
        "",
        f"Goal (wok ≥ 99 % at ≤ {100 * GOAL_SHARE:.0f} % of the hourly fleet's GPU-h, means "
        f"over the seeds): {'**met**' if met else '**not met**'} "
        f"({_pct(wok_att)} % at {100 * ratio:.1f} %).",
        "",
        "The search's windows against the first whole day on the searched schedule "
        "(the largest difference over the hours, in points; how many hours that day served "
        "under 99 %; the hours given one pod more, in any round, where a whole day served "
        "under 99 % an hour its window had served at 99 %): "
        + "; ".join(
            "seed {}: {:.2f}, {} ({})".format(
                h["seed"], gap, under, ", ".join(f"{a:02d}:00" for a in added) or "none"
            )
            for h, _ in both
            for gap, under, added in [window_gap(h)]
        )
        + ".",
        "",
        f"Hour by hour, seed {both[0][0]['seed']}: the hourly fleet's pods and B (+1: "
        "one more than the search found, where the whole day served the hour under 99 %), "
        "its attainment in the search's window, in the first whole day and in the reported "
        "one, the window's attainment with one pod fewer than the search found; wok's ready "
        "+ pending pods (hourly mean) and attainment.",
        "",
        "| hour | arrivals/s | pods | window % | first day % | day % | one fewer, window % "
        "| wok pods | wok % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    h0, w0 = both[0]
    for hour, (row, wrow) in enumerate(zip(h0["hourly"], w0["hourly"], strict=False)):
        added = hour in h0.get("added", [])
        searched = row["replicas"] - added
        fewer = [a for n, _, a in row["probes"] if n == searched - 1]
        lines.append(
            f"| {hour:02d}:00 | {row['arrived'] / HOUR_S:.1f} | {row['replicas']} "
            f"B{row['batch']}{' (+1)' if added else ''} | {_pct(row['window'])} "
            f"| {_pct(row.get('day_searched', row['met'] / max(1, row['arrived'])))} "
            f"| {_pct(row['met'] / max(1, row['arrived']))} "
            f"| {_pct(max(fewer)) if fewer else '-'} "
            f"| {wrow['ready'] + wrow['pending']:.2f} "
            f"| {_pct(wrow['met'] / max(1, wrow['arrived']))} |"
        )
    lines.append("")
    return lines


def plot(runs: list[dict], path: Path) -> None:
    """Per scale: the load per hour, and both fleets' pods (seed 0 bold, other seeds thin)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales = sorted({r["scale"] for r in runs if pairs(runs, r["scale"])})
    if not scales:
        return
    fig, axes = plt.subplots(2, len(scales), figsize=(6 * len(scales), 6), squeeze=False)
    for col, scale in enumerate(scales):
        both = pairs(runs, scale)
        load, pods = axes[0][col], axes[1][col]
        hours = range(len(both[0][0]["hourly"]))
        load.bar(hours, [r["arrived"] / HOUR_S for r in both[0][0]["hourly"]], color="tab:gray")
        load.set_title(f"ServeGen day ×{scale:g}", fontsize="medium")
        load.set_ylabel(f"arrivals/s (seed {both[0][0]['seed']})")
        for i, (h, w) in enumerate(both):
            width, alpha = (2.0, 1.0) if i == 0 else (0.8, 0.4)
            label = i == 0
            pods.step(
                hours,
                [r["replicas"] for r in h["hourly"]],
                where="mid",
                color="tab:green",
                linewidth=width,
                alpha=alpha,
                label="hourly fleet" if label else None,
            )
            pods.plot(
                hours,
                [r["ready"] + r["pending"] for r in w["hourly"]],
                color="tab:blue",
                linewidth=width,
                alpha=alpha,
                label="wok ready + pending (hourly mean)" if label else None,
            )
        pods.set_ylim(bottom=0)
        pods.set_ylabel("pods")
        pods.set_xlabel("hour of the day")
        pods.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(runs: list[dict], command: str, out: Path) -> None:
    out.write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
    render(runs, command, out)


def render(runs: list[dict], command: str, out: Path) -> None:
    out.with_suffix(".md").write_text(markdown(runs, command))
    plot(runs, out.with_suffix(".png"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="1,3", help="the day's rate ×, comma-separated")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated")
    parser.add_argument("--policies", default=f"{HOURLY},{WOK}", help="which to run")
    parser.add_argument("--jobs", type=int, default=2, help="parallel simulations")
    parser.add_argument(
        "--runs-from",
        default="",
        help="PATH[,PATH…]: take wok's runs from bench/autoscaling/daytrace.py's JSONs, and the "
        "runs of other JSONs of this script (a settled hourly fleet replaces one not settled)",
    )
    parser.add_argument(
        "--settle", action="store_true", help="settle the stored hourly fleets not settled yet"
    )
    parser.add_argument("--render", action="store_true", help="no simulation: rewrite from JSON")
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON (.md, .png beside it)")
    args = parser.parse_args()
    stored = json.loads(args.out.read_text()) if args.out.is_file() else {"runs": []}
    runs: list[dict] = stored["runs"]
    command = "nice -n 5 .venv/bin/python bench/autoscaling/hourly_fleet.py " + " ".join(
        sys.argv[1:]
    )
    for path in filter(None, args.runs_from.split(",")):
        runs = runs_from(Path(path), runs)
    if args.render:
        write(runs, stored.get("command", command), args.out)
        print(args.out.with_suffix(".md").read_text())
        return 0
    if args.settle:  # only that: the searches and wok's days run without it
        for i, run in enumerate(tqdm(runs, desc="settle", file=sys.stderr)):
            if run["policy"] == HOURLY and "added" not in run:
                runs[i] = settled(run)
                write(runs, command, args.out)
        return 0
    done = {r["key"] for r in runs}
    todo = [  # seed by seed, so that a stopped run leaves whole seeds at each scale
        (policy, float(scale), int(seed))
        for seed in args.seeds.split(",")
        for scale in args.scales.split(",")
        for policy in filter(None, args.policies.split(","))
        if key(policy, float(scale), int(seed)) not in done
    ]
    write(runs, command, args.out)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, *job) for job in todo]
        for future in tqdm(as_completed(futures), total=len(futures), desc="days", file=sys.stderr):
            run = future.result()
            runs.append(run)
            try:
                write(runs, command, args.out)
            except Exception as error:  # the JSON is written, and the other days run on
                tqdm.write(f"rendering failed: {error!r}", file=sys.stderr)
            tqdm.write(
                f"{run['key']}: {_pct(run['attainment'])} % at {run['gpu_hours']:.2f} GPU-h",
                file=sys.stderr,
            )
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
