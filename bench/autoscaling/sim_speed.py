"""The fleet simulator's speed on a sample of `wok evaluate`'s jobs, side by side with a commit.

`wok evaluate` must run its whole default matrix in 30 minutes on the project's 2-core machine,
so the simulator's speed is a requirement. This runs the same jobs (one per kind of condition of
the matrix) with the working tree's packages and with those of `--against` (a commit, exported
with `git archive`), alternating in fresh processes, and reports each job's median CPU seconds
(the process's own, so that other work on the shared machine does not count) on both sides and
their ratio; it also checks that both sides give the same attainment and
GPU-hours to the last digit (a faster simulator must not change a result).

    nice -n 19 .venv/bin/python bench/autoscaling/sim_speed.py --against f4d1ed6 --repeats 3

`--engines` times the simulator's two engines instead, side by side in one run: `step` (one
exact scheduler iteration per engine step, the reference) and `event` (the default), both of the
working tree, plus the event engine of `--against` when given, on the headline run (`wok simulate
--policy wok`: the code trace at x3, 26,457 requests) and on one policy over the ServeGen day at
x1 (`wok evaluate`'s `day` condition, 1.85 M requests). Each simulation runs in a fresh process,
the sides alternating, and the record of every request and every tick must be the same on all.

    nice -n 19 .venv/bin/python bench/autoscaling/sim_speed.py --engines --against 5f865a0 \
        --repeats 3 --day-repeats 1

Writes bench/autoscaling/results/sim_speed.md and .json with `--engines`, sim_speed_matrix.md and
.json without.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("", "batch", "cluster", "contracts", "operator", "runtime", "sim")
# (trace, scale, pod start, SLO set, seed, policy, variant): one job of each kind the matrix runs.
JOBS = [
    ("code", 4.0, 180.0, "loose", 1, "wok", 0),
    ("code", 3.0, 90.0, "tight", 2, "wok", 0),
    ("code", 3.0, 90.0, "loose", 0, "static", 5064),
    ("code", 3.0, 90.0, "loose", 0, "hpa-concurrency-swept", 3),
    ("conv", 1.0, 90.0, "loose", 3, "wok", 0),
    ("conv", 1.0, 90.0, "loose", 0, "keda-waiting-swept", 2),
    ("mooncake", 1.0, 30.0, "tight", 4, "wok", 0),
]
CHILD = """
import json, sys, time
from wok_sim.evaluation_matrix import STATIC, WARM_UP_S, Condition, Job, context
from wok_sim.evaluation_runner import run_job
out = {}
for trace, scale, start, slo, seed, policy, variant in json.loads(sys.argv[1]):
    job = Job(Condition(trace, scale, start, slo), seed, policy, variant)
    context(job.condition, seed, warm_start_fleet=policy != STATIC)  # not timed
    t = time.process_time()  # CPU seconds: the shared machine's load does not count
    o = run_job(job)
    label = f"{trace} x{scale:g} {start:g} s {slo} seed {seed} {o.name}" + (
        f" B{o.batch}" if o.batch else "")
    out[label] = [time.process_time() - t, o.name, o.attainment, o.gpu_hours]
print(json.dumps(out))
"""


# The engines' jobs: (label, what the child builds). The headline is `wok simulate --policy wok`'s
# run; the day is `wok evaluate`'s `day` condition with the wok policy on seed 0.
ENGINE_JOBS = ("headline", "day")
ENGINE_CHILD = """
import hashlib, json, sys, time
import numpy
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.policies import load_registry
from wok_contracts.slos import Slos
from wok_sim.report import summarize
job, fast = sys.argv[1], sys.argv[2] == "1"
if job == "headline":
    from wok_contracts.profile import load_profile
    from wok_contracts.traces import load_trace, scale_rate
    from wok_sim.cli import DEFAULT_PROFILE, DEFAULT_TRACE, DEFAULT_TRACE_RATE_SCALE
    from wok_operator.plan import batch_mem_of, warm_start
    from wok_sim.policies import PolicyContext
    profile = load_profile(DEFAULT_PROFILE)
    slos = Slos(2.0, 0.1, 5.0)
    requests = load_trace(str(DEFAULT_TRACE), seed=0)
    requests = scale_rate(requests, DEFAULT_TRACE_RATE_SCALE, mode="overlay", seed=0)
    ctx = PolicyContext(profile=profile, slo_ttft_s=2.0, slo_tpot_s=0.1, slo_e2e_s=5.0,
        max_replicas=32, batch_mem=batch_mem_of(profile, requests), cold_start_s=90.0,
        requests=tuple(requests), start_replicas=warm_start(profile, requests, slos))
    config = FleetConfig(profile=profile, cold_start_s=90.0, seed=0, fast=fast)
else:
    from wok_sim.evaluation_matrix import STATIC, WARM_UP_S, Condition, Job, context
    from wok_sim.evaluation_runner import run_job
    ctx = context(Condition("day", 1.0, 90.0, "loose"), 0)
    slos = Slos(ctx.slo_ttft_s, ctx.slo_tpot_s)
    config = FleetConfig(profile=ctx.profile, cold_start_s=90.0, seed=0, fast=fast,
        score_from_s=WARM_UP_S)
policy = load_registry()["wok"].variants(ctx)[0]
requests = list(ctx.requests)
t = time.process_time()  # CPU seconds: the shared machine's load does not count
run = simulate_fleet(requests, policy, config)
seconds = time.process_time() - t
result = summarize(policy.name, run, slos)
# Exact: what each request got and every tick; the times go to a file, compared within 1 µs.
digest = hashlib.sha256(repr(([(r.request_id, r.outcome, r.pod, r.output_tokens,
    r.cached_tokens) for r in run.records], [(k.time_s, k.desired, k.ready, k.pending, k.batch,
    k.waiting, k.reason) for k in run.timeline])).encode()).hexdigest()[:16]
numpy.save(sys.argv[3], numpy.array([(numpy.nan if r.first_token_s is None else r.first_token_s,
    r.finish_s) for r in run.records]))
print(json.dumps([seconds, len(run.records), run.steps, result.slo_attainment,
    result.gpu_hours, digest]))
"""


def run_engine(root: Path, job: str, fast: bool, times_path: Path) -> list:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / p) for p in PACKAGES)}
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_CHILD, job, "1" if fast else "0", str(times_path)],
        cwd=root, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def engines(args: argparse.Namespace) -> int:
    """The step and event engines (and the event engine of --against) side by side."""
    started = time.monotonic()
    times: dict[str, dict[str, list[float]]] = {}
    results: dict[str, dict[str, list]] = {}
    deltas: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides: dict[str, tuple[Path, bool]] = {"step": (ROOT, False), "event": (ROOT, True)}
        if args.against:
            sides[f"event at {args.against}"] = (export(args.against, Path(tmp)), True)
        for job in args.only:
            repeats = args.day_repeats if job == "day" else args.repeats
            for _ in range(repeats):
                for i, (side, (root, fast)) in enumerate(sides.items()):
                    path = Path(tmp) / f"{job}-{i}.npy"
                    seconds, *result = run_engine(root, job, fast, path)
                    times.setdefault(job, {}).setdefault(side, []).append(seconds)
                    results.setdefault(job, {})[side] = result
                    print(job, side, f"{seconds:.2f} s", result, file=sys.stderr, flush=True)
            # Every request's first-token and finish times against the step engine's.
            reference = np.load(Path(tmp) / f"{job}-0.npy")
            for i, side in enumerate(sides):
                other = np.load(Path(tmp) / f"{job}-{i}.npy")
                if other.shape != reference.shape or not np.array_equal(
                    np.isnan(other), np.isnan(reference)
                ):
                    deltas.setdefault(job, {})[side] = math.inf
                    continue
                gap = np.nan_to_num(np.abs(other - reference), nan=0.0)
                deltas.setdefault(job, {})[side] = float(gap.max(initial=0.0))
    names = list(sides)
    head = "| run | requests | engine steps | " + " | ".join(f"{n} CPU s" for n in names)
    head += " | step / event |" + (f" {names[2]} / event |" if len(names) > 2 else "")
    head += " max Δt vs step (s) | same outcomes and ticks |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for job in args.only:
        medians = {n: statistics.median(times[job][n]) for n in names}
        first = results[job]["step"]
        same = all(results[job][n] == first for n in names)
        worst = max(deltas[job].values())
        cells = [job, f"{first[0]:,}", f"{first[1]:,}", *(f"{medians[n]:.2f}" for n in names)]
        cells.append(f"{medians['step'] / medians['event']:.1f}×")
        if len(names) > 2:
            cells.append(f"{medians[names[2]] / medians['event']:.2f}×")
        cells.append(f"{worst:.1e}")
        cells.append("yes" if same else "**no**")
        rows.append("| " + " | ".join(cells) + " |")
    command = "nice -n 19 .venv/bin/python bench/autoscaling/sim_speed.py " + " ".join(sys.argv[1:])
    text = "\n".join(
        [
            "# The fleet simulator's engines, side by side",
            "",
            f"Made by `{command}` in {time.monotonic() - started:.0f} s on the project's shared "
            "2-core machine (other work ran beside it). CPU seconds (`time.process_time`) of the "
            "simulation alone, the context (trace, planner's warm start) built before the clock "
            f"starts; the median of {args.repeats} runs per engine on the headline run and of "
            f"{args.day_repeats} on the day, each in a fresh process, the engines alternating. "
            "`step`: one exact scheduler iteration per engine step; `event`: the default engine"
            + (
                f"; `event at {args.against}`: the event engine before this change"
                if args.against
                else ""
            )
            + ". Same: every request's outcome, pod, tokens and cached prefix, and every "
            "tick's fleet, batch, queue and reason hash the same on every engine (and so do "
            "the engine steps, the attainment and the GPU-hours); max Δt: the largest "
            "difference of any request's first-token or finish time from the step engine's.",
            "",
            *rows,
            "",
        ]
    )
    write_report(args.out, text, {"command": command, "times": times, "results": results})
    return 0


def write_report(name: str, text: str, payload: dict) -> None:
    """bench/autoscaling/results/NAME.md (the text, also printed) and NAME.json (the figures)."""
    results_dir = RESULTS
    (results_dir / f"{name}.md").write_text(text)
    (results_dir / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(text)


def export(commit: str, into: Path) -> Path:
    """The commit's tree under `into` (no work tree or branch is touched)."""
    archive = into / "tree.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", commit], cwd=ROOT, stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def run_side(root: Path) -> dict[str, list]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / p) for p in PACKAGES)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(JOBS)],
        cwd=root, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="COMMIT")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="results file name (default sim_speed, sim_speed_matrix)")
    parser.add_argument("--engines", action="store_true", help="step vs event engine")
    parser.add_argument("--day-repeats", type=int, default=1, help="with --engines")
    parser.add_argument(
        "--only", nargs="+", choices=ENGINE_JOBS, default=list(ENGINE_JOBS), help="with --engines"
    )
    args = parser.parse_args()
    if args.repeats < 1 or args.day_repeats < 1:
        parser.error("--repeats and --day-repeats must be >= 1")
    if args.engines:
        args.out = args.out or "sim_speed"
        return engines(args)
    if not args.against:
        parser.error("--against COMMIT is needed without --engines")
    args.out = args.out or "sim_speed_matrix"
    started = time.monotonic()
    times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    results: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"before": export(args.against, Path(tmp)), "after": ROOT}
        for _ in range(args.repeats):
            for side, root in sides.items():
                for job, (seconds, *result) in run_side(root).items():
                    times[side].setdefault(job, []).append(seconds)
                    results.setdefault(job, {})[side] = result
    rows, ratios = [], []
    for (job, before), after in zip(times["before"].items(), times["after"].values(), strict=True):
        b, a = statistics.median(before), statistics.median(after)
        same = results[job]["before"] == results[job]["after"]
        ratios.append(b / a)
        rows.append(f"| {job} | {b:.2f} | {a:.2f} | {b / a:.2f}× | {'yes' if same else '**no**'} |")
    command = "nice -n 19 .venv/bin/python bench/autoscaling/sim_speed.py " + " ".join(sys.argv[1:])
    text = "\n".join(
        [
            "# The fleet simulator's speed on a sample of `wok evaluate`'s jobs",
            "",
            f"Made by `{command}` in {time.monotonic() - started:.0f} s on the project's shared "
            f"2-core machine: median CPU seconds of {args.repeats} runs per side, alternating, "
            "each in a fresh process (context built before the clock starts). Before: "
            f"{args.against}; after: the working tree. Same result: attainment, GPU-hours and "
            "the variant's name equal to the last digit.",
            "",
            "| job | before CPU s | after CPU s | speed-up | same result |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Median speed-up {statistics.median(ratios):.2f}×; total "
            f"{sum(statistics.median(v) for v in times['before'].values()):.1f} s → "
            f"{sum(statistics.median(v) for v in times['after'].values()):.1f} s.",
            "",
        ]
    )
    write_report(args.out, text, {"command": command, "times": times, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
