"""The autoscaling comparison: `wok simulate` on the shared Azure code trace, every
policy side by side, at 30, 90 and 180 s pod start and in both rate modes.

Static fleets never start a pod after t = 0, so the pod start cannot change their rows: they are
simulated once per rate mode (at 90 s) and shown in every table of that mode.

    .venv/bin/python bench/autoscaling/autoscale_sim.py            # about 30 min on 2 busy cores
    .venv/bin/python bench/autoscaling/autoscale_sim.py --quick    # 90 s overlay only
    .venv/bin/python bench/autoscaling/autoscale_sim.py --only wok  # rerun the law only
    .venv/bin/python bench/autoscaling/autoscale_sim.py --tables Mooncake  # rerun those tables only

The baselines do not depend on the law: `--only` reruns the named policies on every load and keeps
every other row of the last bench/autoscaling/results/autoscale_sim.json; `--tables` reruns the
tables whose title holds the text and keeps the others.

Writes bench/autoscaling/results/autoscale_sim.md and .json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
SLOS = ["--slo-ttft", "2", "--slo-tpot", "0.1", "--slo-e2e", "5"]
NO_E2E = [*SLOS[:4], "--slo-e2e", "0"]  # TTFT and TPOT only
STATIC = "static-peak,static-mean"
AUTOSCALERS = (
    "wok,sign-step,hpa-waiting,keda-waiting,hpa-concurrency-16,hpa-concurrency-32,hpa-concurrency-48"
    ",ceiling"
)
PROFILE = "sim:llama-3-8b-80g"
SHARED_TRACE = ROOT / "bench" / "traces" / "azure_llm_2023_code.csv"
# Two more public traces (bench/traces/README.md), run with the law's defaults; development traces
# too (the defaults were judged with them in view): overlay-scaled the same way as the shared trace,
# TTFT and TPOT SLOs
# (their answers run to hundreds of tokens, so an E2E SLO would measure output length).
HELD_OUT = {
    "Azure conversation trace (2023)": ROOT / "bench" / "traces" / "azure_llm_2023_conv.csv",
    "Mooncake conversation trace": ROOT / "bench" / "traces" / "mooncake_conversation.jsonl",
}
# Synthetic loads of another shape than the traces: smooth
# decode-heavier ramps (512-token prompts, 128-token answers, exponential), TTFT and TPOT SLOs.
SYNTHETIC = {
    "scripted ramps (512/128 tokens), 90 s pod start": (
        "script:300@2-20,600@20,300@20-2,300@2,300@2-30,300@30-5,600@5"
    ),
    "Poisson 12 req/s (512/128 tokens), 90 s pod start": "poisson:12:1800",
}
COLUMNS = (
    ("slo_attainment", "all SLOs", "{:.1%}"),
    ("ttft_attainment", "TTFT", "{:.1%}"),
    ("tpot_attainment", "TPOT", "{:.1%}"),
    ("e2e_attainment", "E2E", "{:.1%}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("p99_ttft_s", "P99 TTFT s", "{:.2f}"),
    ("p99_tpot_s", "P99 TPOT s", "{:.3f}"),
    ("p99_e2e_s", "P99 E2E s", "{:.1f}"),
    ("scale_events", "scale events", "{}"),
    ("flips", "flips", "{}"),
    ("rejected", "rejected", "{}"),
    ("batch_size", "B", "{}"),
)


def load_of(mode: str, trace: str | None = None) -> list[str]:
    if trace is not None:  # a synthetic load: no rate scaling, no E2E SLO
        return ["--trace", trace, *NO_E2E]
    return ["--rate-scale", "3", "--rate-mode", mode, *SLOS]


def held_out_load(trace: Path, scale: float) -> list[str]:
    """A held-out trace's `wok simulate` arguments: overlay at `scale` (`held_out_scale`), TTFT
    and TPOT SLOs."""
    return [
        "--trace",
        str(trace),
        "--rate-scale",
        str(scale),
        "--rate-mode",
        "overlay",
        *NO_E2E,
    ]


def run_policies(load: list[str], cold_start: int, policies: str) -> dict:
    command = [
        str(ROOT / ".venv" / "bin" / "wok"),
        "simulate",
        *load,
        "--cold-start",
        str(cold_start),
        "--policy",
        policies,
        "--jobs",
        "2",
        "--json",
    ]
    print(f"$ {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started = time.monotonic()
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    print(f"  {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return json.loads(out)["policies"]


def held_out_scale(trace: Path) -> float:
    """The rate scale that gives a held-out trace's busiest minute the load, in the planner's
    replicas, that the shared trace's has at x3: "scaled the same way", decided before any run."""
    from wok_contracts.profile import load_profile
    from wok_contracts.slos import Slos
    from wok_contracts.traces import load_trace
    from wok_operator.plan import LengthMix, peak_rate, replica_capacity

    profile = load_profile(PROFILE)
    slos = Slos(2.0, 0.1, None)

    def peak_replicas(path: Path, scale: float) -> float:
        requests = load_trace(str(path))
        mix = LengthMix.of_requests(requests, profile.max_model_len)
        per_replica = replica_capacity(profile, mix, profile.kv_blocks, slos)
        return scale * peak_rate(requests, 60.0) / per_replica

    return round(peak_replicas(SHARED_TRACE, 3.0) / peak_replicas(trace, 1.0), 2)


def cell(value: object, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def markdown_table(rows: dict[str, dict]) -> str:
    static_peak = rows.get("static-peak", {}).get("gpu_hours")
    titles = " | ".join(title for _, title, _ in COLUMNS)
    head = f"| policy | {titles} | GPU-h vs static-peak |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for name, row in rows.items():
        ratio = f"{row['gpu_hours'] / static_peak:.0%}" if static_peak else "-"
        cells = " | ".join(cell(row.get(key), fmt) for key, _, fmt in COLUMNS)
        lines.append(f"| {name} | {cells} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="90 s, overlay only")
    parser.add_argument(
        "--only", metavar="POLICIES", help="rerun these (comma-separated), keep the other rows"
    )
    parser.add_argument(
        "--tables", metavar="TEXT", help="rerun the tables whose title holds TEXT, keep the others"
    )
    args = parser.parse_args()
    out = RESULTS
    previous: dict[str, dict[str, dict]] = {}
    if args.only or args.tables:
        previous = json.loads((out / "autoscale_sim.json").read_text())
    results, held_out, synthetic = run_tables(args)
    for tables in (results, held_out, synthetic):
        for title, rows in tables.items():
            tables[title] = {**previous.get(title, {}), **rows}
    everything = {**results, **held_out, **synthetic}
    (out / "autoscale_sim.json").write_text(json.dumps(everything, indent=2) + "\n")
    markdown = write_markdown(results, held_out, synthetic, args.only, args.tables)
    (out / "autoscale_sim.md").write_text(markdown)
    print(f"wrote {out / 'autoscale_sim.md'}", file=sys.stderr)
    return 0


Tables = dict[str, dict[str, dict]]


def run_tables(args: argparse.Namespace) -> tuple[Tables, Tables, Tables]:
    """Every table's rows, by title: the shared trace's by rate mode and pod start, the held-out
    traces', the synthetic loads'. A policy or table that --only or --tables leaves out is not
    run (its rows are empty)."""
    only = set(args.only.split(",")) if args.only else None

    def chosen(policies: str) -> str:
        names = policies.split(",")
        return ",".join(n for n in names if only is None or n in only)

    def run_simulate(load: list[str], cold_start: int, policies: str, title: str = "") -> dict:
        names = chosen(policies)
        if not names or (args.tables and args.tables not in title):
            return {}
        return run_policies(load, cold_start, names)

    modes = ("overlay",) if args.quick else ("overlay", "compress")
    starts = (90,) if args.quick else (30, 90, 180)
    results: dict[str, dict[str, dict]] = {}
    for mode in modes:
        titles = [f"{mode}, {start} s pod start" for start in starts]
        static = run_simulate(load_of(mode), 90, STATIC, " ".join(titles))
        for start, title in zip(starts, titles, strict=True):
            results[title] = {**run_simulate(load_of(mode), start, AUTOSCALERS, title), **static}
    synthetic = (
        {}
        if args.quick
        else {
            title: run_simulate(load_of("overlay", trace), 90, f"{AUTOSCALERS},{STATIC}", title)
            for title, trace in SYNTHETIC.items()
        }
    )
    held_out: dict[str, dict[str, dict]] = {}
    for title, path in HELD_OUT.items():
        if args.quick or not path.exists():
            continue
        scale = held_out_scale(path)
        load = held_out_load(path, scale)
        for start in (90, 180):
            table = f"{title}, x{scale:g} overlay, {start} s pod start"
            held_out[table] = run_simulate(load, start, f"{AUTOSCALERS},{STATIC}", table)
    return results, held_out, synthetic


def write_markdown(
    results: Tables, held_out: Tables, synthetic: Tables, only: str | None, tables: str | None
) -> str:
    """autoscale_sim.md: how the tables were made, then each table."""
    parts = [
        "# Autoscaling in the fleet simulator",
        "",
        "Made by `.venv/bin/python bench/autoscaling/autoscale_sim.py` (each table: `wok simulate "
        "--rate-scale 3 --rate-mode MODE --cold-start S --slo-ttft 2 --slo-tpot 0.1 --slo-e2e 5 "
        "--policy all`), profile `sim:llama-3-8b-80g` (an analytic model, not a measurement), "
        "the shared Azure code trace (bench/traces), random routing, 5 s scrapes. Fixed-batch "
        "baselines show their best B in hindsight. `all SLOs`: the share of requests within "
        "TTFT 2 s, mean TPOT 0.1 s and E2E 5 s together (rejected requests miss all). "
        "`ceiling` is a bound, not a policy to run: every pod asked for at the first tick from "
        "the autoscalers' shared start, so no autoscaler can serve more within the SLOs at that "
        "pod start (its GPU-hours mean nothing).",
    ]
    if only:
        parts[-1] += (
            f" The rows of {only} were rerun with `--only {only}` after the law's last "
            "change; every other row is from an earlier run."
        )
    if tables:
        parts[-1] += (
            f" The tables whose title holds '{tables}' were rerun with `--tables "
            f"{tables}`; every other table is from the last run."
        )
    for title, rows in results.items():
        parts += ["", f"## {title}", "", markdown_table(rows)]
    if held_out:
        parts += [
            "",
            "## More traces: the same defaults on other traffic (development traces too)",
            "",
            "`wok simulate --trace TRACE --rate-scale X --rate-mode overlay --slo-ttft 2 "
            "--slo-tpot 0.1 --cold-start S --policy all`; X gives the trace's busiest minute "
            "the planner's load of the shared trace's at x3 (`held_out_scale`).",
        ]
        for title, rows in held_out.items():
            parts += ["", f"### {title}", "", markdown_table(rows)]
    if synthetic:
        parts += [
            "",
            "## Synthetic loads (not traces): the same defaults on other shapes",
            "",
            "`wok simulate --trace LOAD --slo-ttft 2 --slo-tpot 0.1 --policy all`; loads: "
            + "; ".join(f"{title}: `{trace}`" for title, trace in SYNTHETIC.items()),
        ]
        for title, rows in synthetic.items():
            parts += ["", f"### {title}", "", markdown_table(rows)]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
