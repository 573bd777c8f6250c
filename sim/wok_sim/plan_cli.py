"""`wok plan`: the capacity plan of `wok_operator.plan` as a table, JSON or a plot.

Registered by `wok_sim.cli`; the planner is imported only when the command runs, as every part of
the `wok` CLI does.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wok_contracts.traces import TraceRequest
    from wok_operator.plan import Plan

DEFAULT_PROFILE = "sim:llama-3-8b-80g"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "plan",
        help="B_opt, QPS_max, replicas and cost per token from a step-time profile and SLOs",
        # argparse cannot say that --output-tokens goes with --prompt-tokens; the usage does.
        usage="wok plan (--trace TRACE | --prompt-tokens N --output-tokens N) --slo-ttft S "
        "--slo-tpot S [--slo-e2e S] [--profile PROFILE] [--qps X] [--json] [--plot PATH]",
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="a profile path or sim:NAME")
    lengths = parser.add_mutually_exclusive_group(required=True)
    lengths.add_argument(
        "--trace", help="a trace (Azure CSV, Mooncake .jsonl, poisson:RATE:SECONDS): its lengths"
    )
    lengths.add_argument("--prompt-tokens", type=int, metavar="N", help="mean prompt length")
    parser.add_argument(
        "--output-tokens",
        type=int,
        metavar="N",
        help="mean output length (required with --prompt-tokens)",
    )
    parser.add_argument("--slo-ttft", type=float, required=True, metavar="S")
    parser.add_argument("--slo-tpot", type=float, required=True, metavar="S")
    parser.add_argument("--slo-e2e", type=float, default=None, metavar="S", help="optional")
    parser.add_argument("--qps", type=float, metavar="X", help="a target rate to size replicas for")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="latency/throughput vs B (PNG)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from wok_contracts.profile import load_profile
    from wok_contracts.slos import Slos
    from wok_contracts.traces import load_trace
    from wok_operator.api import StepProfileSpec
    from wok_operator.plan import LengthMix, arrival_rate, plan

    profile = load_profile(args.profile)
    slos = Slos(args.slo_ttft, args.slo_tpot, args.slo_e2e)
    requests: list[TraceRequest] = []
    if args.trace is not None:
        if args.output_tokens is not None:
            raise ValueError("--output-tokens goes with --prompt-tokens, not with --trace")
        requests = load_trace(args.trace)
        if not requests:
            raise ValueError(f"trace {args.trace} has no requests")
        mix = LengthMix.of_requests(requests, profile.max_model_len)
    else:
        if args.output_tokens is None:
            raise ValueError("--prompt-tokens needs --output-tokens")
        context = args.prompt_tokens + args.output_tokens
        if context > profile.max_model_len:
            # The runtime refuses such a request (400 context_length_exceeded): no SLO to miss.
            raise ValueError(
                f"--prompt-tokens {args.prompt_tokens} and --output-tokens {args.output_tokens} "
                f"need {context} tokens of context; the profile {profile.name}'s model holds "
                f"{profile.max_model_len}"
            )
        mix = LengthMix.of_means(args.prompt_tokens, args.output_tokens)
    result = plan(profile, mix, slos, qps=args.qps)
    rate = arrival_rate(requests)
    # What an InferenceService carries so that its law prices each tick's mix with this profile.
    step_profile = StepProfileSpec.of(profile).model_dump(by_alias=True)
    if args.json:
        print(json.dumps(as_json(result, rate) | {"step_profile": step_profile}, indent=2))
    else:
        print(table(result, len(requests), rate))
        print("\nThe InferenceService's spec.scaling (μ from this profile for the mix it serves):")
        print(yaml.safe_dump({"stepProfile": step_profile}, sort_keys=False).rstrip())
    if args.plot:
        write_plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def as_json(result: Plan, trace_rate: float | None) -> dict[str, Any]:
    """The plan; `trace_rate` is the trace's mean arrival rate (None without a trace)."""
    rate = trace_rate
    return {
        "profile": result.profile,
        "requests_in_mix": result.requests_in_mix,
        "mean_prompt_tokens": result.mean_prompt_tokens,
        "mean_output_tokens": result.mean_output_tokens,
        "slo": {
            "ttft_s": result.slos.ttft_s,
            "tpot_s": result.slos.tpot_s,
            "e2e_s": result.slos.e2e_s,
        },
        "batch_limit": result.batch_limit,
        "b_opt": result.b_opt,
        "t_batch_s": result.at_b_opt.time_in_batch_s,
        "qps_max": result.qps_max,
        "output_tokens_per_s": result.at_b_opt.output_tokens_per_s,
        "gpu_seconds_per_output_token": result.gpu_seconds_per_output_token,
        "gpu_hours_per_1k_output_tokens": result.gpu_hours_per_1k_output_tokens,
        "qps": result.qps,
        "replicas": result.replicas,
        "trace_mean_qps": rate,
        "replicas_for_trace_mean": None if rate is None else _replicas(rate, result.qps_max),
        "curve": [
            {
                "batch": p.batch,
                "tpot_mean_s": p.step_s,
                "p99_tpot_s": p.p99_tpot_s,
                "p99_ttft_s": p.p99_ttft_s,
                "p99_e2e_s": p.p99_e2e_s,
                "attainment": p.attainment,
                "requests_per_s": p.requests_per_s,
                "output_tokens_per_s": p.output_tokens_per_s,
                "token_load": p.token_load,
                "kv_load": p.kv_load,
            }
            for p in result.curve
        ],
    }


def _replicas(qps: float, qps_max: float) -> int:
    return math.ceil(qps / qps_max)


def table(result: Plan, trace_requests: int, trace_rate: float | None) -> str:
    slo = result.slos
    e2e = "none" if slo.e2e_s is None else f"{slo.e2e_s:g} s"
    lines = [
        f"profile {result.profile}; {result.requests_in_mix} request(s) in the length mix, mean "
        f"prompt {result.mean_prompt_tokens:.0f}, mean output {result.mean_output_tokens:.1f} "
        f"tokens",
        f"SLOs (P99, service time only): TTFT {slo.ttft_s:g} s, TPOT {slo.tpot_s:g} s, E2E {e2e}",
        "",
        f"{'B':>5} {'TPOT':>7} {'p99TPOT':>8} {'p99TTFT':>8} {'p99E2E':>8} {'in SLO':>7} "
        f"{'req/s':>7} {'tok/s':>8} {'budget':>7} {'KV':>5}",
    ]
    for p in result.curve:
        mark = "  <- B_opt" if p.batch == result.b_opt else ""
        lines.append(
            f"{p.batch:5d} {p.step_s:7.4f} {p.p99_tpot_s:8.4f} {p.p99_ttft_s:8.3f} "
            f"{p.p99_e2e_s:8.2f} {p.attainment:7.1%} {p.requests_per_s:7.2f} "
            f"{p.output_tokens_per_s:8.0f} {p.token_load:7.0%} {p.kv_load:5.0%}{mark}"
        )
    at = result.at_b_opt
    lines += [
        "",
        f"B_opt    {result.b_opt} (the step budget and KV pool allow up to {result.batch_limit})",
        f"t_batch  {at.time_in_batch_s:.3f} s (mean time a request holds a slot at B_opt)",
        f"QPS_max  {result.qps_max:.2f} requests/s per replica ({at.output_tokens_per_s:.0f} "
        f"output tokens/s)",
        f"C_token  {result.gpu_seconds_per_output_token * 1000:.3f} GPU-ms per output token, "
        f"{result.gpu_hours_per_1k_output_tokens:.6f} GPU-hours per 1k output tokens",
    ]
    if result.qps is not None:
        lines.append(f"replicas {result.replicas} for {result.qps:g} requests/s")
    if trace_rate is not None:
        lines.append(
            f"trace    {trace_requests} requests, mean {trace_rate:.2f} requests/s: "
            f"{_replicas(trace_rate, result.qps_max)} replica(s) at its mean rate"
        )
    return "\n".join(lines)


def write_plot(result: Plan, path: Path) -> None:
    """Throughput and latency against B, with B_opt and the SLOs marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = [p.batch for p in result.curve]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    top.plot(batches, [p.requests_per_s for p in result.curve], marker=".", color="tab:blue")
    top.set_ylabel("requests/s per replica")
    top.axvline(result.b_opt, color="tab:red", linestyle="--", label=f"B_opt = {result.b_opt}")
    top.legend(loc="lower right")
    for label, values, slo, color in (
        ("TPOT mean", [p.step_s for p in result.curve], result.slos.tpot_s, "tab:orange"),
        ("P99 TPOT", [p.p99_tpot_s for p in result.curve], None, "tab:brown"),
        ("P99 TTFT", [p.p99_ttft_s for p in result.curve], result.slos.ttft_s, "tab:blue"),
        ("P99 E2E", [p.p99_e2e_s for p in result.curve], result.slos.e2e_s, "tab:green"),
    ):
        bottom.plot(batches, values, marker=".", color=color, label=label)
        if slo is not None:
            bottom.axhline(slo, color=color, linestyle=":", linewidth=1)
    bottom.axvline(result.b_opt, color="tab:red", linestyle="--")
    bottom.set_yscale("log")
    bottom.set_xlabel("running batch B")
    bottom.set_ylabel("seconds (service time)")
    bottom.legend(loc="upper left", fontsize="small")
    fig.suptitle(f"{result.profile}: QPS_max {result.qps_max:.2f}/s at B_opt {result.b_opt}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
