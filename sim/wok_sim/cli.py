"""`wok simulate`: every policy on the same arrivals, through the fleet simulator, side by side.

Simulations run in parallel processes (`--jobs`), one per policy variant; each worker builds its
policies from the registry, so nothing but names crosses the process boundary. The simulator is
imported only when the command runs: the `wok` CLI must start in images that lack the operator's
or the runtime's dependencies.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wok_sim import evaluate, plan_cli

if TYPE_CHECKING:
    from wok_contracts.profile import StepProfile
    from wok_contracts.slos import Slos
    from wok_contracts.traces import TraceRequest
    from wok_sim.fleet import FleetConfig
    from wok_sim.policies import PolicyContext
    from wok_sim.report import PolicyResult

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "bench" / "traces" / "azure_llm_2023_code.csv"
DEFAULT_PROFILE = "sim:llama-3-8b-80g"
#: The default trace is run at three times its rate (overlaid copies): the headline run that
#: docs/control-law.md and the README quote. Any other trace runs at its own rate by default.
DEFAULT_TRACE_RATE_SCALE = 3.0
#: Policies whose variants are static fleets over a range of pod counts at each B, and whose pick
#: is the smallest fleet at the planner's attainment target: searched by bisection on the pod
#: count (`fleet_search`; attainment does not fall as pods are added), not one simulation each.
SEARCHED = ("static-peak",)

#: What each policy name means; `wok simulate --help` prints it and a test keeps it in step with
#: the registry (a name with digits stands for its family: hpa-concurrency-N).
POLICIES: dict[str, str] = {
    "wok": "wok's control law (wok_operator.control.decide) as the operator runs it: it moves "
    "the batch cap and the replica count; the InferenceService carries the run's step profile "
    "(`scaling.stepProfile`), so μ is the profile's capacity for the mix it finishes",
    "sign-step": "the clipped sign-step rule the law started from (decide_sign_step): the batch "
    "moves one step on the sign of the queue's error, the replicas by one pod once the batch is "
    "at its cap; kept for comparison",
    "wok-frozen-cap": "the law with its batch pinned at min(B_max, B_mem) every tick (an "
    "ablation: what the moving batch buys; not in `all`)",
    "wok-frozen-plan": "the law with its batch pinned at `wok plan`'s B_opt for the trace's mix "
    "(an ablation; not in `all`)",
    "wok-no-profile": "the law without a step profile: μ is what a saturated pod showed, in "
    "requests/s, whatever the mix since (an ablation; not in `all`)",
    "wok-no-floor": "the law without its proven floor (an ablation; not in `all`)",
    "wok-forgive": "the law whose own shortfall's misses (pods starting, a warm start, its "
    "scale-down) do not spend the error budget (an experiment; not in `all`)",
    "wok-sla": "the law with B_SLA in its batch cap (an experiment; not in `all`)",
    "wok-step-budget": "the law, plus a rule on the step token budget pushed to every pod: "
    "halved on a TPOT breach before the batch may step down, doubled on a TTFT breach with TPOT "
    "slack, in [256, the profile's step_token_budget], from 2048 (an experiment; not in `all`)",
    "wok-step-budget-N": "the same rule, never below N tokens (wok-step-budget-1024; not in `all`)",
    "wok-fixed-budget": "the law with the step token budget pinned at 2048: the control for "
    "wok-step-budget (not in `all`)",
    "static-peak": "the smallest fixed fleet that serves 99 % of requests within every SLO "
    "(a search by bisection over replica counts at each B)",
    "static-mean": "the fixed fleet the trace's mean rate needs at the planner's per-pod capacity",
    "hpa-waiting": "the upstream HPA on vllm:num_requests_waiting, average 5 per pod, synced every "
    "15 s",
    "keda-waiting": "KEDA's Prometheus scaler on the fleet's summed waiting queue, threshold 5, "
    "queried at every 15 s HPA sync (KEDA's default: no metrics cache)",
    "hpa-concurrency-N": "the HPA on each pod's running + waiting requests, target N",
    "hpa-concurrency-swept": "the HPA on running + waiting, its target swept over 2…48 and B over "
    "the batch sizes; the best in hindsight (not in `all`)",
    "keda-waiting-swept": "KEDA on the summed waiting queue, its threshold swept over 1…20 and B "
    "over the batch sizes; the best in hindsight (not in `all`)",
    "aibrix-kpa": "AIBrix's KPA (stable and panic windows) on each pod's KV cache usage, target "
    "0.5, as AIBrix's samples (not in `all`)",
    "aibrix-apa": "AIBrix's APA (tolerance band, scale rates) on each pod's KV cache usage, "
    "target 0.5 (not in `all`)",
    "aibrix-kpa-swept": "the KPA on KV usage 0.05…0.5 and on the waiting queue 2…100, every B; "
    "the best in hindsight (not in `all`)",
    "aibrix-apa-swept": "the APA on KV usage 0.05…0.5 and on the waiting queue 2…100, every B; "
    "the best in hindsight (not in `all`)",
    "dynamo-planner": "Dynamo's SLA planner, aggregated: constant load predictor, replicas from "
    "the profile's engine rate at the SLOs (not in `all`)",
    "dynamo-planner-arima": "the planner with its ARIMA load predictor (the `field` extra; not "
    "in `all`)",
    "dynamo-planner-prophet": "the planner with its Prophet load predictor (the `field` extra; "
    "not in `all`)",
    "dynamo-planner-swept": "the planner with its TTFT and ITL targets scaled by 0.2…1, every B; "
    "the best in hindsight (not in `all`)",
    "wva": "llm-d's Workload Variant Autoscaler: its queueing model sizes one variant for the "
    "SLOs (not in `all`)",
    "wva-swept": "WVA with its targets scaled by 0.2…1, every B; the best in hindsight (not in "
    "`all`)",
    "ceiling": "a bound, not a policy: every pod (--max-replicas) asked for at the first tick; "
    "no autoscaler serves more within the SLOs at that pod start (its GPU-hours mean nothing)",
}


def help_epilog() -> str:
    """The columns and the policies, for `wok simulate --help` (one line each)."""
    from wok_sim.columns import COLUMNS

    def entries(pairs: Sequence[tuple[str, str]]) -> list[str]:
        width = max(len(name) for name, _ in pairs)
        indent = " " * (width + 4)
        return [
            textwrap.fill(f"  {name:<{width}}  {meaning}", 100, subsequent_indent=indent)
            for name, meaning in pairs
        ]

    return "\n".join(
        [
            "The default run is the documented headline run: the Azure code trace at 3x its "
            "rate (overlay),",
            "TTFT 2 s, TPOT 0.1 s, E2E 5 s, 90 s pod start, every policy.",
            "",
            "columns (attainment is a share of all requests; refused, timed-out and dropped "
            "ones miss",
            "every SLO):",
            *entries(COLUMNS),
            "",
            "policies (--policy; fixed-batch baselines are swept over B and reported at their "
            "best):",
            *entries(list(POLICIES.items())),
        ]
    )


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "simulate",
        help="autoscaling policies on a request trace, in the fleet simulator (no cluster)",
        description="Every autoscaling policy on the same arrivals, through the fleet "
        "simulator,\nside by side: SLO attainment, P99s and GPU-hours.",
        epilog=help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    plan_cli.register(commands)
    evaluate.register(commands)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`wok simulate`'s flags (and `wok demo`'s, which runs it): in its help's order."""
    add_trace_arguments(parser)
    add_fleet_arguments(parser)
    add_policy_arguments(parser)
    add_output_arguments(parser)


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The arrivals: the trace, its rate, a spliced length mix, and the part that is scored."""
    parser.add_argument(
        "--trace",
        default=str(DEFAULT_TRACE),
        help="an Azure CSV, Mooncake .jsonl or compact ServeGen .json path (its default day, "
        "drawn with --seed), poisson:RATE:SECONDS, or script[:S@R[-R2],…] (default: the Azure "
        "code trace in bench/traces)",
    )
    parser.add_argument(
        "--rate-scale",
        type=float,
        metavar="X",
        help=f"arrival rate multiplier (default: {DEFAULT_TRACE_RATE_SCALE:g} on the default "
        "trace, 1 on any other)",
    )
    parser.add_argument(
        "--rate-mode",
        choices=("compress", "overlay"),
        default="overlay",
        help="scale by overlaying shifted copies of the trace, or by compressing its time",
    )
    parser.add_argument(
        "--splice",
        metavar="TRACE@START-END",
        help="requests arriving between START and END seconds take TRACE's lengths (a context "
        "mix that shifts mid-run; the arrivals stay)",
    )
    parser.add_argument("--duration", type=float, metavar="S", help="simulate the first S seconds")
    parser.add_argument(
        "--score-from",
        type=float,
        default=0.0,
        metavar="S",
        help="count only the requests that arrive from S seconds on, and the GPU time from then "
        "(`wok evaluate` scores from 300 s, so that the autoscalers' warm start and the static "
        "fleets' full start cost nothing)",
    )


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The pods: their start, the SLOs they are held to, their step profile and engine."""
    parser.add_argument("--cold-start", type=float, default=90.0, metavar="S", help="pod start")
    parser.add_argument(
        "--slo-ttft", type=float, default=2.0, metavar="S", help="time to first token"
    )
    parser.add_argument(
        "--slo-tpot", type=float, default=0.1, metavar="S", help="mean time per output token"
    )
    parser.add_argument(
        "--slo-e2e", type=float, default=5.0, metavar="S", help="end to end; 0: no E2E SLO"
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="a profile path or sim:NAME")
    parser.add_argument(
        "--engine",
        choices=("wok", "vllm"),
        default="wok",
        help="the pods' engine: vllm pods keep --max-num-seqs fixed and queue without bound "
        "(vllm_pod.py); the policy still sets the replica count",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=128,
        help="vllm pods' batch cap (vLLM's flag; 128 is its CPU server's default)",
    )


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The autoscalers and the world they act in: routing, Prometheus' scrapes, the fleet's
    ceiling, the pods' prefix cache, the seed of every random draw."""
    parser.add_argument("--policy", default="all", help="all, or NAME[,NAME…] (below)")
    parser.add_argument("--routing", choices=("random", "least-loaded"), default="random")
    parser.add_argument("--scrape-interval", type=float, default=5.0, metavar="S")
    parser.add_argument(
        "--scrape-failure", type=float, default=0.0, metavar="P", help="per-scrape probability"
    )
    parser.add_argument("--max-replicas", type=int, default=32)
    parser.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="pods compute every prompt in full (by default a trace's hash_ids are reused)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="random draws: overlay copies, routing, scrapes"
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """What the run writes, the simulator's engine and its parallelism."""
    parser.add_argument("--plot", type=Path, metavar="DIR", help="write plots here")
    parser.add_argument(
        "--ticks",
        type=Path,
        metavar="DIR",
        help="write each policy's control ticks here (ticks-NAME.jsonl: the load, the fleet, the "
        "P99s it saw and the reason it gave): which rule acted, and when",
    )
    parser.add_argument(
        "--sim-engine",
        choices=("event", "step"),
        default="event",
        help="event: decode stretches in closed form (the default); step: one scheduler "
        "iteration per engine step, the reference the other is tested against",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable results")
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel simulations"
    )


_WORKER: dict[str, Any] = {}


def _init_worker(ctx: PolicyContext, config: FleetConfig, slos: Slos) -> None:
    _WORKER.update(ctx=ctx, config=config, slos=slos)


def _simulate(name: str, index: int) -> PolicyResult:
    from wok_sim.fleet import simulate_fleet
    from wok_sim.policies import load_registry
    from wok_sim.report import summarize

    ctx, config = _WORKER["ctx"], _WORKER["config"]
    policy = load_registry()[name].variants(ctx)[index]
    run = simulate_fleet(list(ctx.requests), policy, config)
    return summarize(name, run, _WORKER["slos"], batch_size=policy.fixed_batch)


def run(args: argparse.Namespace) -> int:
    from wok_contracts.profile import load_profile
    from wok_contracts.slos import Slos

    if args.jobs < 1 or args.max_replicas < 1:
        raise ValueError("--jobs and --max-replicas must be >= 1")
    profile = load_profile(args.profile)
    slos = Slos(args.slo_ttft, args.slo_tpot, args.slo_e2e if args.slo_e2e != 0 else None)
    requests = requests_of(args)
    config = fleet_config(args, profile)
    ctx = policy_context(args, profile, slos, requests)
    results, chosen = simulate_policies(args, ctx, config, slos)
    first = chosen[0]
    slowest = max(results.values(), key=lambda r: r.wall_seconds)
    print(
        f"{first.requests} requests ({first.clipped_requests} clipped to max_model_len "
        f"{profile.max_model_len}), profile {profile.name}, "
        f"{len(results)} simulation{'s' * (len(results) != 1)}; the slowest "
        f"{slowest.wall_seconds:.1f} s ({slowest.name}, {slowest.steps:,} steps)",
        file=sys.stderr,
    )
    print_results(args, chosen, slos, requests)
    return 0


def requests_of(args: argparse.Namespace) -> list[TraceRequest]:
    """The trace's requests at --rate-scale, with --splice's lengths; --score-from is checked
    against its last arrival."""
    from wok_contracts.traces import load_trace, parse_splice, scale_rate, splice

    requests = load_trace(args.trace, seed=args.seed)
    rate_scale = rate_scale_of(args.trace, args.rate_scale)
    if rate_scale != 1.0:
        requests = scale_rate(requests, rate_scale, mode=args.rate_mode, seed=args.seed)
    if args.splice:
        ref, start_s, end_s = parse_splice(args.splice)
        requests = splice(requests, load_trace(ref, seed=args.seed), start_s, end_s, seed=args.seed)
    last = max((r.arrival_s for r in requests), default=0.0)
    if not 0.0 <= args.score_from < last:
        raise ValueError(
            f"--score-from must be in [0, {last:g}) s (the last arrival), got {args.score_from:g}"
        )
    return requests


def fleet_config(args: argparse.Namespace, profile: StepProfile) -> FleetConfig:
    """The simulated fleet's settings from the flags."""
    from wok_sim.fleet import FleetConfig

    if not 0.0 <= args.scrape_failure < 1.0:
        raise ValueError(f"--scrape-failure must be in [0, 1), got {args.scrape_failure}")
    return FleetConfig(
        profile=profile,
        cold_start_s=args.cold_start,
        routing=args.routing,
        scrape_interval_s=args.scrape_interval,
        scrape_failure_prob=args.scrape_failure,
        seed=args.seed,
        duration_s=args.duration,
        prefix_caching=args.prefix_caching,
        score_from_s=args.score_from,
        vllm_max_num_seqs=args.max_num_seqs if args.engine == "vllm" else None,
        fast=args.sim_engine == "event",
    )


def policy_context(
    args: argparse.Namespace, profile: StepProfile, slos: Slos, requests: list[TraceRequest]
) -> PolicyContext:
    """What every policy is built from: the profile, the SLOs, the trace, the planner's
    memory cap and warm start."""
    from wok_operator.plan import batch_mem_of, warm_start
    from wok_sim.policies import PolicyContext

    return PolicyContext(
        profile=profile,
        slo_ttft_s=slos.ttft_s,
        slo_tpot_s=slos.tpot_s,
        slo_e2e_s=slos.e2e_s,
        max_replicas=args.max_replicas,
        batch_mem=batch_mem_of(profile, requests),
        cold_start_s=args.cold_start,
        requests=tuple(requests),
        start_replicas=warm_start(profile, requests, slos),
    )


def simulate_policies(
    args: argparse.Namespace, ctx: PolicyContext, config: FleetConfig, slos: Slos
) -> tuple[dict[tuple[str, int], PolicyResult], list[PolicyResult]]:
    """Every variant of each --policy simulated (a `SEARCHED` one's by bisection), and each
    policy's pick among its variants, in --policy's order."""
    from wok_sim.policies import load_registry, resolve

    names = resolve(args.policy)
    registry = load_registry()
    jobs = [
        (name, i)
        for name in names
        if name not in SEARCHED
        for i in range(len(registry[name].variants(ctx)))
    ]
    results = _run_all(jobs, ctx, config, slos, workers=args.jobs) if jobs else {}
    for name in (n for n in names if n in SEARCHED):
        results |= _search_fleets(name, ctx, config, slos, workers=args.jobs)
    chosen = []
    for name in names:
        variants = [results[key] for key in sorted(results) if key[0] == name]
        chosen.append(variants[registry[name].pick(variants)])
    return results, chosen


def print_results(
    args: argparse.Namespace,
    chosen: list[PolicyResult],
    slos: Slos,
    requests: list[TraceRequest],
) -> None:
    """The picks as JSON (--json) or as the headline and a table; plots and ticks if asked."""
    from wok_sim.report import table, to_json, write_plots, write_ticks

    if args.json:
        print(to_json(chosen))
    else:
        from wok_operator.plan import TARGET_ATTAINMENT
        from wok_sim.report import headline

        print(textwrap.fill(headline(chosen, target=TARGET_ATTAINMENT), 100), end="\n\n")
        print(table(chosen))
    if args.plot:
        arrivals = [r.arrival_s for r in requests]
        for path in write_plots(chosen, slos, args.plot, arrivals_s=arrivals):
            print(f"plot: {path}", file=sys.stderr)
    if args.ticks:
        for path in write_ticks(chosen, args.ticks):
            print(f"ticks: {path}", file=sys.stderr)


def _search_fleets(
    name: str, ctx: PolicyContext, config: FleetConfig, slos: Slos, *, workers: int
) -> dict[tuple[str, int], PolicyResult]:
    """A `SEARCHED` policy's variants that decide its pick: at each B, the smallest fleet at the
    attainment target and the largest under it (or, where none reaches it, the smallest at the
    largest's attainment), found in rounds of simulations, every B's next probe at once. Under
    attainment monotone in N, the pick over them is the pick over every variant."""
    from wok_operator.plan import TARGET_ATTAINMENT
    from wok_sim.fleet_search import FleetSearch
    from wok_sim.policies import load_registry

    variants = load_registry()[name].variants(ctx)
    ladders: dict[int | None, list[int]] = {}  # B -> its variants' indices by pod count
    for i, policy in enumerate(variants):
        ladders.setdefault(policy.fixed_batch, []).append(i)
    for ladder in ladders.values():
        ladder.sort(key=lambda i: variants[i].start().replicas)
    searches = {
        batch: FleetSearch(
            len(ladder), len(ladder) // 3, TARGET_ATTAINMENT, TARGET_ATTAINMENT, plateau=0.0
        )
        for batch, ladder in ladders.items()
    }
    results: dict[tuple[str, int], PolicyResult] = {}
    while probes := [
        (batch, rung) for batch, search in searches.items() for rung in search.next_probes()
    ]:
        found = _run_all(
            [(name, ladders[batch][rung - 1]) for batch, rung in probes],
            ctx,
            config,
            slos,
            workers=workers,
        )
        for batch, rung in probes:
            result = found[(name, ladders[batch][rung - 1])]
            searches[batch].add(rung, result.slo_attainment)
        results |= found
    return results


def rate_scale_of(trace: str, asked: float | None) -> float:
    """--rate-scale as given, else the headline run's scale on the default trace and 1 on any
    other (a trace of your own runs at its own rate)."""
    if asked is not None:
        return asked
    return DEFAULT_TRACE_RATE_SCALE if Path(trace) == DEFAULT_TRACE else 1.0


def _run_all(
    jobs: list[tuple[str, int]],
    ctx: PolicyContext,
    config: FleetConfig,
    slos: Slos,
    *,
    workers: int,
) -> dict[tuple[str, int], PolicyResult]:
    from tqdm import tqdm

    progress = tqdm(total=len(jobs), desc="simulations", unit="run", file=sys.stderr, disable=None)
    results: dict[tuple[str, int], PolicyResult] = {}
    if workers == 1 or len(jobs) == 1:
        _init_worker(ctx, config, slos)
        for job in jobs:
            results[job] = _simulate(*job)
            progress.update()
    else:
        with ProcessPoolExecutor(
            max_workers=min(workers, len(jobs)),
            initializer=_init_worker,
            initargs=(ctx, config, slos),
        ) as pool:
            futures = {pool.submit(_simulate, *job): job for job in jobs}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                progress.update()
    progress.close()
    return results
