"""`wok evaluate`: every policy over a matrix of conditions, against the static frontier of each.

One run of `wok simulate` is one draw: a routing seed, an overlay seed, one rate scale, one pod
start, one SLO set. A law can look good on one draw and lose on the next, so this command runs a
matrix of them and reports each policy's mean and its range over seeds. For every condition it
computes the static frontier (every fleet size N at its best fixed B, mean over the same seeds)
and says whether each policy's mean attainment is at or above the frontier at the policy's own
mean GPU-hours (linear between adjacent N: a fleet that alternated between N and N + 1 would get
there), and whether it uses fewer GPU-hours than every baseline variant (HPA on concurrency,
KEDA on waiting, swept over their own targets and over B) whose mean attainment reaches its own.

Fairness, said once: every policy is scored from the same time (`WARM_UP_S`), requests and GPU
time before it count for none (static fleets start at full size, autoscalers at the planner's
warm start); the static fleets and the baselines pick their B and target in hindsight, which no
real deployment can, so they are an upper bound on what tuning them buys. The matrix is a list
of jobs (one simulation each) run in a process pool; `--quick` runs a small one for tests.

`SWEPT_BASELINES` is the one table of rivals: a policy registered with its sweep (its variants
its targets × B, each named with its target) joins every condition by adding its name there;
`--baselines` runs a subset.

`--trace PATH[@SCALE,…]` runs the same protocol on a trace file of your own (held out: the law
was never tuned on it): every scale given, a 90 s pod start (`--cold-start`), each SLO set.
The static fleets of a frontier are found by bisection on the pod count (`fleet_search`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from wok_sim.evaluation_analysis import (
    Evaluation,
    evaluate,
)
from wok_sim.evaluation_journal import Journal
from wok_sim.evaluation_matrix import (
    ON_REQUEST,
    SLO_SETS,
    SWEPT_BASELINES,
    TRACES,
    WINDOW,
    Condition,
    Outcome,
    matrix,
    pick,
    split_window,
)
from wok_sim.evaluation_runner import run_matrix

MAIN_POLICIES = ("wok", "wok-frozen-cap", "wok-frozen-plan")  # those registered are run


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="every policy over a matrix of traces, rate scales, pod starts, SLOs and seeds, "
        "against the static frontier and swept HPA / KEDA baselines (fleet simulator)",
    )
    parser.add_argument(
        "--policy",
        "--policies",
        default=",".join(MAIN_POLICIES),
        help="NAME[,NAME…] (default: wok and its batch ablations; names not registered are "
        "skipped with a note)",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(SWEPT_BASELINES),
        help="the swept rivals run on every condition: NAME[,NAME…] or none (default: all, "
        f"{', '.join(SWEPT_BASELINES)})",
    )
    add_condition_flags(parser)
    parser.add_argument(
        "--out", type=Path, default=Path("bench/autoscaling/results"), metavar="DIR"
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="no simulation: write the table and plot again from an earlier run's JSON",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel simulations"
    )
    parser.add_argument(
        "--journal",
        type=Path,
        metavar="JSONL",
        help="append each finished simulation here, and skip those already in it: a stopped run "
        "continues where it stopped (the same code only; the results do not change)",
    )
    parser.set_defaults(func=run)


def add_condition_flags(parser: Any) -> None:
    """The flags that pick the matrix's conditions, or a trace file's."""
    from wok_sim.held_out import HELD_OUT_START_S, TRACE_FORMATS

    parser.add_argument("--quick", action="store_true", help="a two-condition matrix (minutes)")
    parser.add_argument(
        "--slo", default=",".join(SLO_SETS), help="the conditions of these SLO sets only"
    )
    default_traces = ",".join(t for t in TRACES if t not in ON_REQUEST)
    parser.add_argument(
        "--trace",
        action="append",
        metavar="NAMES | PATH[@SCALE,…]",
        help=f"repeatable. NAME[,NAME…]: the matrix's conditions on these built-in traces only "
        f"(default: {default_traces}; also {', '.join(ON_REQUEST)}: the ServeGen day and its "
        "08:00-13:00 morning ramp, each at x1 and x3). PATH: a "
        "trace file of your own, held out ("
        + ", ".join(f"{suffix}: {kind}" for suffix, kind in TRACE_FORMATS.items())
        + "), at each rate SCALE (overlay; default 1), under each --slo set, with the "
        "matrix's scoring",
    )
    parser.add_argument(
        "--scale",
        metavar="X[,X…]",
        help="the matrix's conditions at these rate scales only (default: all of them)",
    )
    parser.add_argument(
        "--starts",
        metavar="S[,S…]",
        help="the matrix's conditions at these pod starts only (default: all of them)",
    )
    parser.add_argument(
        "--window",
        metavar="START-END",
        help="cut each trace file to this window (seconds, or 8h-13h; its clock starts at 0 "
        "there) before scaling it: a morning's ramp out of a day",
    )
    parser.add_argument(
        "--cold-start",
        type=float,
        default=HELD_OUT_START_S,
        metavar="S",
        help="the pod start of a trace file's conditions",
    )


def report_name(
    *,
    quick: bool,
    traces: Iterable[str],
    files: Sequence[str],
    slos: Iterable[str],
    scales: Sequence[float] = (),
    starts: Sequence[float] = (),
) -> str:
    """The report's file name (no suffix): `evaluation` for the whole default matrix, else what
    the run kept (traces, trace files, rate scales, pod starts, SLO sets), so that a part never
    overwrites the whole."""
    picked = [f"x{s:g}" for s in scales] + [f"{s:g}s" for s in starts]
    traces, slos = set(traces), set(slos)
    default = {t for t in TRACES if t not in ON_REQUEST}
    whole = not files and not picked and (traces, slos) == (default, set(SLO_SETS))
    stems = [Path(split_window(path)[0]).stem for path in files]
    parts = [] if whole else [*sorted(traces), *stems, *picked, *sorted(slos)]
    return "-".join(["evaluation", *(["quick"] if quick else []), *parts])


def render(path: Path) -> int:
    from wok_sim.evaluation_report import markdown, outcomes_of, plot, to_json

    report = json.loads(path.read_text())
    outcomes = outcomes_of(report)
    conditions = list(dict.fromkeys(o.job.condition for o in outcomes))
    policies = list(dict.fromkeys(v["policy"]["name"] for v in report["verdicts"]))
    ev = evaluate(outcomes, conditions, policies)
    ev = Evaluation(ev.verdicts, ev.frontiers, ev.baselines, len(outcomes), report["wall_s"])
    path.with_suffix(".md").write_text(markdown(ev, report["command"]))
    path.write_text(to_json(ev, outcomes, report["command"]))
    plot(ev, path.with_suffix(".png"))
    print(markdown(ev, report["command"]))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.render:
        return render(args.render)
    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    if not (math.isfinite(args.cold_start) and args.cold_start >= 0):
        raise ValueError(f"--cold-start must be >= 0 s, got {args.cold_start}")
    policies, baselines = policies_asked(args.policy, args.baselines)
    conditions, name = conditions_asked(args)
    started = time.perf_counter()
    outcomes = run_matrix(
        conditions, policies, baselines, workers=args.jobs, journal=Journal(args.journal)
    )
    ev = evaluate(outcomes, conditions, policies)
    ev = Evaluation(
        ev.verdicts, ev.frontiers, ev.baselines, len(outcomes), time.perf_counter() - started
    )
    write_report(ev, outcomes, args.out, name)
    return 0


def policies_asked(policy: str, baselines: str) -> tuple[list[str], list[str]]:
    """The registered policies of `--policy` (those not registered skipped with a note) and the
    swept baselines of `--baselines`."""
    from wok_sim.policies import load_registry

    registry = load_registry()
    asked = [n.strip() for n in policy.split(",") if n.strip()]
    if not asked:
        raise ValueError("--policy needs at least one name")
    policies = [n for n in asked if n in registry]
    for name in asked:
        if name not in registry:
            print(f"wok evaluate: policy {name!r} is not registered: skipped", file=sys.stderr)
    if not policies:
        raise ValueError(f"no registered policy in {policy!r} (known: {', '.join(registry)})")
    rivals = [] if baselines == "none" else [b.strip() for b in baselines.split(",")]
    unknown = [b for b in rivals if b not in SWEPT_BASELINES or b not in registry]
    if unknown:
        raise ValueError(
            f"unknown baseline {', '.join(unknown)} (known: {', '.join(SWEPT_BASELINES)}, none)"
        )
    return policies, rivals


def conditions_asked(args: argparse.Namespace) -> tuple[list[Condition], str]:
    """The matrix's conditions `--trace`, `--slo`, `--scale` and `--starts` keep, then those of
    each trace file (`--window`, `--cold-start`); and the report's name for them."""
    from wok_contracts.traces import parse_window
    from wok_sim.held_out import check_held_out, held_out, parse_scales, parse_traces

    default_traces = [t for t in TRACES if t not in ON_REQUEST]
    names, files = parse_traces(args.trace or [",".join(default_traces)])
    traces = set(names)
    slos = {s.strip() for s in args.slo.split(",") if s.strip()}
    if not slos or slos - set(SLO_SETS):
        raise ValueError(f"--slo takes {', '.join(SLO_SETS)}, got {args.slo!r}")
    scales = parse_scales(args.scale, "--scale") if args.scale else ()
    starts = parse_scales(args.starts, "--starts") if args.starts else ()
    conditions = pick(matrix(quick=args.quick), traces, slos, scales=scales, starts=starts)
    if args.window:
        parse_window(args.window)  # a bad window is one clear line before anything runs
        if not files:
            raise ValueError("--window cuts trace files: name one with --trace PATH")
        files = [(f"{path}{WINDOW}{args.window}", factors) for path, factors in files]
    held = held_out(files, slos, args.cold_start)
    check_held_out(held)
    name = report_name(
        quick=args.quick,
        traces=traces,
        files=[path for path, _ in files],
        slos=slos,
        scales=scales,
        starts=starts,
    )
    return conditions + held, name


def write_report(ev: Evaluation, outcomes: list[Outcome], out: Path, name: str) -> None:
    """The table, the JSON and the plot under `out`, named `name`; the table on stdout too."""
    from wok_sim.evaluation_report import markdown, plot, to_json

    command = (
        "wok evaluate " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["evaluate"]
        else "wok evaluate"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(markdown(ev, command))
    (out / f"{name}.json").write_text(to_json(ev, outcomes, command))
    plot(ev, out / f"{name}.png")
    print(markdown(ev, command))
    for suffix in ("md", "json", "png"):
        print(f"wrote {out / f'{name}.{suffix}'}", file=sys.stderr)
