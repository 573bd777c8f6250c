"""wok's engine against Hugging Face `transformers`, side by side in one run, on this CPU.

Why: continuous batching is the runtime's reason to exist; this measures what it buys over the
standard ways to serve the same weights, on the same machine, in the same process, back to back
(the machine is shared, so only ratios within one run mean anything):

  (a) mixed lengths: 64 requests, prompts 16–64, outputs 8–128, 16 slots. wok continuous vs HF
      `generate` in static batches of 16 (target ≥ 2×), and vs transformers' own continuous
      batching manager when it runs here.
  (b) equal lengths (no static-batching waste to win back): 32 × (32 in, 32 out), batch 32.
      wok continuous vs HF `generate` (target ≥ 1×).
  (c) the Azure code trace's length mix (scaled to max_model_len): wok continuous vs wok
      serial (target ≥ 4×).

Every request ignores EOS and asks for an exact output length; tok/s counts requested tokens
only. wok's greedy tokens are checked against HF's for the same prompts.

    .venv/bin/python bench/runtime/engine_vs_hf.py            # writes results/engine_vs_hf.*
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_reference import (
    HFRun,
    hf_continuous_generate,
    hf_static_generate,
    load_hf_model,
)

from wok_contracts.traces import TraceRequest, uniform_poisson
from wok_runtime.core.engine import EngineConfig
from wok_runtime.core.model_runner import ModelRunner
from wok_runtime.tools.bench_engine import (
    format_table,
    percentile,
    prompt_token_ids,
    run_engine_bench,
    trace_workload,
)

# The shared Azure code trace (bench/traces/README.md).
TRACE = Path(__file__).resolve().parents[1] / "traces" / "azure_llm_2023_code.csv"
MAX_MODEL_LEN = 256


def hf_row(run: HFRun, num_requests: int, batch: int) -> dict[str, Any]:
    return {
        "mode": run.name,
        "num_requests": num_requests,
        "duration_s": run.duration_s,
        "output_tokens": run.useful_tokens,
        "output_tokens_per_s": run.output_tokens_per_s,
        "requests_per_s": num_requests / run.duration_s,
        "e2e_p50_s": percentile(run.e2e_s, 50),
        "e2e_p99_s": percentile(run.e2e_s, 99),
        # Static generate has no per-token timestamps here: TTFT/TPOT are not measured.
        "ttft_p50_s": float("nan"),
        "ttft_p99_s": float("nan"),
        "tpot_p50_s": float("nan"),
        "mean_batch_size": float(min(batch, num_requests)),  # static: batches are full
        "kv_usage_max": float("nan"),
        "useful_slot_fraction": (
            run.useful_tokens / run.computed_slots if run.computed_slots else float("nan")
        ),
    }


def agreement(wok: dict[int, list[int]], hf: list[list[int]]) -> float:
    """Share of requests whose greedy tokens are identical in wok and HF."""
    same = sum(wok.get(i) == tokens for i, tokens in enumerate(hf))
    return same / max(len(hf), 1)


def wok_run(
    runner: ModelRunner,
    reqs: list[TraceRequest],
    prompts: list[list[int]],
    *,
    mode: str,
    batch: int,
    tokens: dict | None,
) -> dict[str, Any]:
    config = EngineConfig(
        mode=mode,  # type: ignore[arg-type]
        max_batch_size=batch,
        max_wait_ms=0,
        max_num_batched_tokens=runner.max_num_batched_tokens,
        max_queue=len(reqs),
        queue_timeout_s=1e9,
        max_model_len=MAX_MODEL_LEN,
    )
    result = run_engine_bench(runner, config, reqs, prompts, progress=True, tokens=tokens)
    result["mode"] = f"wok-{mode}"
    return result


@dataclass(frozen=True)
class Scenario:
    """One workload of the comparison and its baseline (`bench/gpu/gpu_check.py` runs them too)."""

    key: str
    workload: str  # what the report says it is
    requests: list[TraceRequest]
    prompts: list[list[int]]  # the requests' prompt token ids, the same for wok and HF
    batch: int
    baseline: str  # "hf-static": HF generate in static batches of `batch`; "wok-serial"
    target: str


def build_scenarios(
    names: set[str],
    *,
    vocab: int,
    seed: int,
    num_requests: int = 64,
    trace_requests: int = 32,
    equal_output_len: int = 32,
    trace: Path = TRACE,
) -> list[Scenario]:
    """The workloads (a), (b), (c) of the module docstring, those in `names` ("a", "b", "c")."""
    out = []
    if "a" in names:
        reqs = uniform_poisson(
            num_requests,
            rate=math.inf,
            prompt_tokens=(16, 64),
            output_tokens=(8, 128),
            seed=seed,
        )
        workload = (
            f"{len(reqs)} requests, prompts 16-64, outputs 8-128 tokens, all at once, 16 slots"
        )
        prompts = prompt_token_ids(reqs, vocab_size=vocab, seed=seed)
        out.append(
            Scenario(
                "a_mixed_lengths",
                workload,
                reqs,
                prompts,
                16,
                "hf-static",
                ">= 2x HF generate static batches",
            )
        )
    if "b" in names:
        reqs = uniform_poisson(
            32,
            rate=math.inf,
            prompt_tokens=(32, 32),
            output_tokens=(equal_output_len, equal_output_len),
            seed=seed + 1,
        )
        workload = f"32 requests, 32 prompt + {equal_output_len} output tokens each, batch 32"
        prompts = prompt_token_ids(reqs, vocab_size=vocab, seed=seed + 1)
        out.append(
            Scenario(
                "b_equal_lengths", workload, reqs, prompts, 32, "hf-static", ">= 1x HF generate"
            )
        )
    if "c" in names:
        reqs = trace_workload(
            trace, num_requests=trace_requests, max_model_len=MAX_MODEL_LEN, speedup=math.inf
        )
        workload = (
            f"first {len(reqs)} requests of the Azure 2023 code trace, prompts scaled so the "
            f"longest is {MAX_MODEL_LEN // 2} tokens, outputs kept (clipped to fit), all at "
            f"once; mean prompt {sum(r.prompt_tokens for r in reqs) / len(reqs):.0f}, "
            f"mean output {sum(r.output_tokens for r in reqs) / len(reqs):.0f} tokens"
        )
        prompts = prompt_token_ids(reqs, vocab_size=vocab, seed=seed)
        out.append(
            Scenario(
                "c_azure_code_trace", workload, reqs, prompts, 16, "wok-serial", ">= 4x serial"
            )
        )
    return out


def run_scenario(
    runner: ModelRunner, hf, scenario: Scenario, *, with_wok_static: bool = False
) -> tuple[dict[str, Any], HFRun | None]:
    """wok continuous against the scenario's baseline: its report, and HF's run (if any)."""
    reqs, prompts, batch = scenario.requests, scenario.prompts, scenario.batch
    if scenario.baseline == "wok-serial":
        rows = [
            wok_run(runner, reqs, prompts, mode="continuous", batch=batch, tokens=None),
            wok_run(runner, reqs, prompts, mode="serial", batch=1, tokens=None),
        ]
        speedup = rows[0]["output_tokens_per_s"] / rows[1]["output_tokens_per_s"]
        result = {
            "workload": scenario.workload,
            "rows": rows,
            "speedup_continuous_vs_serial": speedup,
            "target": scenario.target,
        }
        return result, None
    wants = [r.output_tokens for r in reqs]
    wok_tokens: dict[int, list[int]] = {}
    rows = [wok_run(runner, reqs, prompts, mode="continuous", batch=batch, tokens=wok_tokens)]
    static = hf_static_generate(hf, prompts, wants, batch_size=batch)
    rows.append(hf_row(static, len(reqs), batch))
    if with_wok_static:
        rows.append(wok_run(runner, reqs, prompts, mode="static", batch=batch, tokens=None))
    result = {
        "workload": scenario.workload,
        "rows": rows,
        "speedup_vs_hf_static": rows[0]["output_tokens_per_s"] / rows[1]["output_tokens_per_s"],
        "target": scenario.target,
        "greedy_agreement_with_hf": agreement(wok_tokens, static.outputs),
    }
    return result, static


def warm_up(runner: ModelRunner, hf) -> None:
    """First calls pay one-off allocation and dispatch costs: pay them before timing."""
    warm = uniform_poisson(4, rate=math.inf, prompt_tokens=(8, 16), output_tokens=(4, 4), seed=99)
    prompts = prompt_token_ids(warm, vocab_size=runner.config.vocab_size, seed=99)
    wok_run(runner, warm, prompts, mode="continuous", batch=4, tokens=None)
    hf_static_generate(hf, prompts, [4] * 4, batch_size=4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--scenarios", default="a,b,c")
    parser.add_argument("--num-requests", type=int, default=64, help="(a)")
    parser.add_argument("--trace-requests", type=int, default=32, help="(c)")
    parser.add_argument("--equal-output-len", type=int, default=32, help="(b)")
    parser.add_argument("--no-hf-continuous", action="store_true")
    parser.add_argument("--hf-continuous-timeout", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (default 1: on this shared 2-core machine two OpenMP "
        "threads thrash; one HF decode step measured 11.7 s with 2 threads vs 0.93 s with 1)",
    )
    parser.add_argument("--with-wok-static", action="store_true", help="(a): also wok static")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    began = time.monotonic()

    # 32 full-length sequences fit: no preemption in any scenario, as for HF's dense caches.
    runner = ModelRunner.from_source(
        args.model,
        kv_cache_bytes=32 * MAX_MODEL_LEN * 2 * 30 * 3 * 64 * 4
        if "smollm2" in args.model
        else 64 << 20,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=2048,
    )
    hf = load_hf_model(args.model)
    warm_up(runner, hf)

    report: dict[str, Any] = {
        "command": shlex.join(
            [".venv/bin/python", "bench/runtime/engine_vs_hf.py", *(argv or sys.argv[1:])]
        ),
        "model": args.model,
        "machine": f"{platform.machine()}, {args.threads} torch thread(s), fp32, CPU",
        "torch": torch.__version__,
        "scenarios": {},
    }
    scenarios = build_scenarios(
        set(args.scenarios.split(",")),
        vocab=runner.config.vocab_size,
        seed=args.seed,
        num_requests=args.num_requests,
        trace_requests=args.trace_requests,
        equal_output_len=args.equal_output_len,
    )
    for scenario in scenarios:
        mixed = scenario.key == "a_mixed_lengths"
        result, static = run_scenario(
            runner, hf, scenario, with_wok_static=mixed and args.with_wok_static
        )
        if mixed and static is not None and not args.no_hf_continuous:
            result |= hf_continuous_rows(hf, scenario, static, result["rows"], args)
        report["scenarios"][scenario.key] = result
        print(format_table(result["rows"]), file=sys.stderr)

    report["wall_s"] = time.monotonic() - began
    write_outputs(report, Path(args.out))
    return 0


def hf_continuous_rows(
    hf, scenario: Scenario, static: HFRun, rows: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """(a) also against transformers' own continuous batching, when it runs here: appends its
    row to `rows` and returns the notes."""
    prompts = scenario.prompts
    wants = [r.output_tokens for r in scenario.requests]
    notes: dict[str, Any] = {}
    try:
        # Its duration includes the manager's one-off setup; a one-request run first
        # measures that setup, so the reader can subtract it.
        setup = hf_continuous_generate(hf, prompts[:1], [1], max_batch=scenario.batch)
        notes["hf_continuous_setup_s"] = setup.duration_s
        cb = hf_continuous_generate(
            hf, prompts, wants, max_batch=scenario.batch, timeout_s=args.hf_continuous_timeout
        )
        rows.append(hf_row(cb, len(prompts), scenario.batch))
        notes["hf_continuous_greedy_agreement_with_hf_static"] = sum(
            a == b for a, b in zip(cb.outputs, static.outputs, strict=True)
        ) / len(prompts)
    except Exception as error:  # report, never hide: the comparison is then missing
        notes["hf_continuous"] = f"not measured: {error!r}"[:300]
    return notes


def write_outputs(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_vs_hf.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    lines = [
        "# wok engine vs Hugging Face transformers (CPU, fp32)",
        "",
        f"Command: `{report['command']}`  ",
        f"Model: `{report['model']}`; {report['machine']}; torch {report['torch']}; "
        f"whole run {report['wall_s']:.0f} s. The machine is shared: compare within a table.",
        "",
    ]
    for name, scenario in report["scenarios"].items():
        lines += [f"## {name}", "", scenario["workload"], "", format_table(scenario["rows"]), ""]
        for key, value in scenario.items():
            if key not in ("rows", "workload"):
                shown = f"{value:.2f}" if isinstance(value, float) else value
                lines.append(f"- {key}: {shown}")
        lines.append("")
    (out / "engine_vs_hf.md").write_text("\n".join(lines))
    plot(report, out / "engine_vs_hf.png")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = report["scenarios"]
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 3.6), squeeze=False)
    for ax, (name, scenario) in zip(axes[0], scenarios.items(), strict=True):
        modes = [r["mode"] for r in scenario["rows"]]
        values = [r["output_tokens_per_s"] for r in scenario["rows"]]
        colors = ["tab:orange" if m.startswith("wok") else "tab:blue" for m in modes]
        ax.bar(range(len(modes)), values, color=colors)
        ax.set_xticks(range(len(modes)), modes, rotation=25, ha="right", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("output tokens / s")
    fig.suptitle(f"{report['model']}, CPU fp32: output tokens/s by mode", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
