"""Two benchmark clients against the same servers: where does wok's gap to vLLM come from?

Why: `runtime_vs_vllm.py` (the project's client, `wok bench http`'s `run_bench`) put wok's
`tiny` at 0.95x vLLM's output tok/s at 8 streams; vLLM's own client (`vllm bench serve`, random
dataset) put it at 0.43x, with vLLM's own figure the same under both. The clients differ in what
they send (token ids at temperature 0 against a text prompt with the server's default sampling,
`stream_options.include_usage`, `repetition_penalty`) and in how they count; the servers may
have been started differently. So each server configuration runs in turn, and against each the
clients alternate, `--reps` times, each run `--requests` requests of 128 prompt and 64 output
tokens at 8 concurrent (a closed loop, `ignore_eos`):

  bench-http          wok's `run_bench`: token-id prompts, temperature 0, `return_token_ids`
  vllm-bench          `vllm bench serve --dataset-name random --ignore-eos` as a user runs it
                      (no sampling flags: the server's default, temperature 1)
  vllm-bench-greedy   the same with `--temperature 0`: isolates the sampling path

Servers: vLLM as runtime_vs_vllm.py starts it; wok as it starts it (`--compile`, bfloat16, one
OpenMP thread); wok as a new user starts it (`wok runtime serve --model DIR --device cpu`); and
the variants between those two that isolate the flags. Each run reads the server's own
Prometheus counters (`vllm:prompt_tokens`, `vllm:generation_tokens`, `vllm:request_success`)
before and after, so the tokens each server really processed per request stand beside what the
client counted.

    .venv/bin/python bench/vllm/client_agreement.py     # writes results/client_agreement.*

vLLM and its client come from its cached venv (`make vllm-venv`); its CLI runs through
vllm_bench_client.py. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import selectors
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from runtime_vs_vllm import Server, free_port, log, vllm_server, vllm_version

from wok_cluster.vllm_venv import default_venv, ensure_vllm
from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.tools.bench_http import RequestSpec, run_bench, summarize

RESULTS = Path(__file__).resolve().parent / "results"
LAUNCHER = Path(__file__).resolve().parent / "vllm_bench_client.py"
PROMPT, OUTPUT, CONCURRENCY = 128, 64, 8
COUNTERS = {
    "prompt": "vllm:prompt_tokens_total",
    "generation": "vllm:generation_tokens_total",
    "requests": "vllm:request_success_total",
    "cached": "vllm:prefix_cache_hits_total",  # prompt tokens served from the prefix cache
}
#: Each client's own prompts: two runs with the same prompts would find them in the prefix cache.
SEED_OFFSET = {"bench-http": 0, "vllm-bench": 1000, "vllm-bench-greedy": 2000}
CLIENTS = ("bench-http", "vllm-bench", "vllm-bench-greedy")
METRICS = ("output_tokens_per_s", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s")
COUNTS = (
    "server_prompt_per_req",
    "server_cached_per_req",
    "server_output_per_req",
    "client_output_per_req",
)
CPU = ("server_cpu_ms_per_token", "client_cpu_ms_per_token")
TICKS = os.sysconf("SC_CLK_TCK")
BENCH_WOK = ["--dtype", "bfloat16", "--max-model-len", "512", "--kv-cache-bytes", str(1 << 30)]


@dataclass(frozen=True)
class WokConfig:
    """A `wok runtime serve` start: its name, its flags after `--model DIR --device cpu`, and
    its environment."""

    name: str
    flags: list[str]
    env: dict[str, str]

    def server(self, model_dir: Path, logs: Path) -> Server:
        port = free_port()
        command = [sys.executable, "-m", "wok.cli", "runtime", "serve", "--model", str(model_dir)]
        command += ["--device", "cpu", *self.flags, "--port", str(port)]
        return Server(self.name, command, self.env, "/readyz", port, logs / f"{self.name}.log")

    def shown(self, model_dir: Path) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        command = ["wok", "runtime", "serve", "--model", str(model_dir), "--device", "cpu"]
        return f"{env} {shlex.join([*command, *self.flags])}".strip()


ONE_THREAD = {"OMP_NUM_THREADS": "1"}
#: From the project's start (runtime_vs_vllm.py) to a new user's, one difference at a time.
WOK_CONFIGS = [
    WokConfig("wok-bench", [*BENCH_WOK, "--compile"], ONE_THREAD),
    WokConfig("wok-default", [], {}),
    WokConfig("wok-default-bf16", ["--dtype", "bfloat16"], {}),
    WokConfig("wok-bf16-omp1", ["--dtype", "bfloat16"], ONE_THREAD),
    WokConfig("wok-bf16-omp1-compile", ["--dtype", "bfloat16", "--compile"], ONE_THREAD),
]


# --- the server's own counters -------------------------------------------------------------------


def read_counters(url: str) -> dict[str, float]:
    """The sums (over labels) of the token and request counters on the server's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for key, series in COUNTERS.items():
            if line.startswith(series) and line[len(series)] in "{ ":
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


def server_counts(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Prompt and output tokens per finished request, as the server counted them."""
    requests = after["requests"] - before["requests"]
    per = (lambda key: (after[key] - before[key]) / requests) if requests else (lambda key: None)
    return {
        "server_requests": requests,
        "server_prompt_per_req": per("prompt"),
        "server_cached_per_req": per("cached"),
        "server_output_per_req": per("generation"),
    }


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of a process and its live descendants (vLLM's engine is a child)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS)
    tree = {root}
    grown = True
    while grown:
        children = {pid for pid, (parent, _) in stats.items() if parent in tree} - tree
        tree |= children
        grown = bool(children)
    return sum(stats[pid][1] for pid in tree if pid in stats)


# --- the clients -------------------------------------------------------------------------------


def run_bench_http(url: str, requests: int, seed: int) -> dict[str, Any]:
    specs = [RequestSpec(0.0, PROMPT, OUTPUT)] * requests
    results, elapsed, _ = asyncio.run(
        run_bench([url], specs, max_concurrency=CONCURRENCY, duration_s=300, seed=seed)
    )
    report = summarize(results, elapsed, mean_batch_size=None)
    done = [r for r in results if r.ok]
    counted = sum(r.output_tokens for r in done) / len(done) if done else None
    return {key: report[key] for key in (*METRICS, "completed")} | {
        "client_output_per_req": counted,
        "client_prompt_per_req": PROMPT,
    }


class VllmBenchClient:
    """One `vllm bench serve` process for every run (vllm_bench_client.py --lines)."""

    def __init__(self, python: Path, logs: Path) -> None:
        self.python = python
        self.results = logs / "vllm-bench"
        self.results.mkdir(exist_ok=True)
        self.log = (logs / "vllm-bench.log").open("a")
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        if self.process is None or self.process.poll() is not None:
            command = [str(self.python), str(LAUNCHER), "--lines"]
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
            )
        return self.process

    def _wait_done(self, process: subprocess.Popen[str], timeout_s: float) -> int:
        assert process.stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(timeout=1.0):
                    continue
                line = process.stdout.readline()
                if not line:
                    return -1
                self.log.write(line)
                if line.startswith("vllm-bench-done "):
                    return int(line.split()[1])
        process.kill()
        return -2

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self._start().pid)

    def run(self, url: str, model: str, requests: int, seed: int, extra: list[str]) -> dict:
        name = f"run-{time.monotonic_ns()}.json"
        argv = ["bench", "serve", "--base-url", url, "--model", model]
        argv += ["--dataset-name", "random", "--random-input-len", str(PROMPT)]
        argv += ["--random-output-len", str(OUTPUT), "--ignore-eos"]
        argv += ["--num-prompts", str(requests), "--max-concurrency", str(CONCURRENCY)]
        argv += ["--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el"]
        argv += ["--metric-percentiles", "50,99", "--disable-tqdm", "--save-result"]
        argv += ["--result-dir", str(self.results), "--result-filename", name, *extra]
        process = self._start()
        assert process.stdin is not None
        process.stdin.write(json.dumps(argv) + "\n")
        process.stdin.flush()
        code = self._wait_done(process, timeout_s=400)
        path = self.results / name
        if code != 0 or not path.exists():
            raise RuntimeError(f"vllm bench serve failed ({code}); see its log")
        return vllm_report(json.loads(path.read_text()))

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def vllm_report(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's result JSON in run_bench's keys (seconds)."""
    done = result["completed"]
    return {
        "output_tokens_per_s": result["output_throughput"],
        "tpot_p50_s": result["p50_tpot_ms"] / 1e3,
        "tpot_p99_s": result["p99_tpot_ms"] / 1e3,
        "ttft_p50_s": result["p50_ttft_ms"] / 1e3,
        "ttft_p99_s": result["p99_ttft_ms"] / 1e3,
        "completed": done,
        "client_output_per_req": result["total_output_tokens"] / done if done else None,
        "client_prompt_per_req": result["total_input_tokens"] / done if done else None,
    }


# --- one server, every client ---------------------------------------------------------------------


def run_client(
    client: str, server: Server, vllm: VllmBenchClient, model: str, requests: int, seed: int
) -> dict[str, Any]:
    """One run of `client`, with what the server counted and the CPU each side spent on it
    (both share the machine's two cores: a client's CPU is taken from the server)."""
    assert server.process is not None
    seed += SEED_OFFSET[client]
    before = read_counters(server.url)
    server_cpu = tree_cpu_seconds(server.process.pid)
    if client == "bench-http":
        client_cpu = time.process_time()
        report = run_bench_http(server.url, requests, seed)
        client_cpu = time.process_time() - client_cpu
    else:
        extra = ["--temperature", "0"] if client == "vllm-bench-greedy" else []
        client_cpu = vllm.cpu_seconds()
        report = vllm.run(server.url, model, requests, seed, extra)
        client_cpu = vllm.cpu_seconds() - client_cpu
    server_cpu = tree_cpu_seconds(server.process.pid) - server_cpu
    counts = server_counts(before, read_counters(server.url))
    tokens = counts["server_output_per_req"] * counts["server_requests"]
    per_token = {
        "server_cpu_ms_per_token": server_cpu * 1e3 / tokens if tokens else None,
        "client_cpu_ms_per_token": client_cpu * 1e3 / tokens if tokens else None,
    }
    return report | counts | per_token


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (*METRICS, *COUNTS, *CPU, "client_prompt_per_req"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out | {"runs": runs}


def bench_server(
    server: Server, vllm: VllmBenchClient, model: str, requests: int, reps: int
) -> dict[str, Any]:
    """Starts the server, warms it with both clients, then runs every client `reps` times,
    alternating the order; the server is stopped at the end."""
    server.start(timeout_s=900)
    load = {"load_before": os.getloadavg()[0]}
    try:
        run_client("bench-http", server, vllm, model, 16, seed=99)  # warm-up: one-off costs
        run_client("vllm-bench", server, vllm, model, 16, seed=99)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CLIENTS}
        for rep in range(reps):
            for client in CLIENTS if rep % 2 == 0 else CLIENTS[::-1]:
                report = run_client(client, server, vllm, model, requests, seed=rep)
                runs[client].append(report)
                log(
                    f"{server.name} rep {rep} {client}: {report['output_tokens_per_s']:.0f} "
                    f"tok/s, TPOT P50 {report['tpot_p50_s'] * 1e3:.1f} ms, P99 "
                    f"{report['tpot_p99_s'] * 1e3:.1f} ms; server per request: "
                    f"{report['server_prompt_per_req']} prompt, "
                    f"{report['server_output_per_req']} output"
                )
    finally:
        server.stop()
    load["load_after"] = os.getloadavg()[0]
    return load | {"clients": {c: median_row(r) for c, r in runs.items()}}


def bench_model(
    name: str, *, vllm_python: Path, vllm: VllmBenchClient, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    model_dir = ensure_builtin(name)
    servers: list[tuple[Server, str]] = [
        (
            vllm_server(vllm_python, model_dir, logs),
            "VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server "
            f"--model {model_dir} --dtype bfloat16 --max-model-len 512",
        )
    ]
    servers += [
        (config.server(model_dir, logs), config.shown(model_dir))
        for config in WOK_CONFIGS
        if config.name in args.servers
    ]
    out: dict[str, Any] = {"model": f"builtin:{name}", "servers": []}
    for server, shown in servers:
        if server.name not in args.servers:
            continue
        result = bench_server(server, vllm, str(model_dir), args.requests, args.reps)
        out["servers"].append({"name": server.name, "command": shown} | result)
    return out


# --- report ------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(model: dict[str, Any]) -> list[str]:
    vllm = next((s for s in model["servers"] if s["name"] == "vllm"), None)
    lines = [
        "| server | client | tok/s | ratio to vLLM, same client | TPOT P50 / P99 | "
        "TTFT P50 / P99 | server prompt tok/req (of them cached) | server output tok/req | "
        "client output tok/req | CPU ms per output token, server / client |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for server in model["servers"]:
        for client, row in server["clients"].items():
            base = vllm["clients"][client]["output_tokens_per_s"] if vllm else None
            ratio = "-" if not base else f"{row['output_tokens_per_s'] / base:.2f}×"
            lines.append(
                f"| {server['name']} | {client} | {row['output_tokens_per_s']:.0f} | {ratio} "
                f"| {_ms(row['tpot_p50_s'])} / {_ms(row['tpot_p99_s'])} "
                f"| {_ms(row['ttft_p50_s'])} / {_ms(row['ttft_p99_s'])} "
                f"| {_num(row['server_prompt_per_req'])} "
                f"({_num(row.get('server_cached_per_req'))}) "
                f"| {_num(row['server_output_per_req'])} "
                f"| {_num(row['client_output_per_req'])} "
                f"| {_cpu(row.get('server_cpu_ms_per_token'))} / "
                f"{_cpu(row.get('client_cpu_ms_per_token'))} |"
            )
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Two benchmark clients, the same servers: wok's runtime vs vLLM",
        "",
        f"Produced by `{report['command']}` on {report['when']} ({report['machine']}); "
        f"{report['vllm']}. Per server, the clients alternate, {report['reps']} runs each of "
        f"{report['requests']} requests (128 prompt, 64 output tokens, 8 concurrent, "
        "`ignore_eos`); medians. Latencies in ms. The server columns are the server's own "
        "Prometheus counters (`vllm:prompt_tokens`, `vllm:generation_tokens` per "
        "`vllm:request_success`) over each run, the client column what the client counted.",
    ]
    for model in report["models"]:
        lines += ["", f"## {model['model']}", "", "Servers (1-minute load average, start → end):"]
        lines.append("")
        for server in model["servers"]:
            lines.append(
                f"- {server['name']}: `{server['command']}` "
                f"(load {server['load_before']:.1f} → {server['load_after']:.1f})"
            )
        lines += ["", *table(model)]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.5 * len(models)), squeeze=False)
    for (ax_tok, ax_tpot), model in zip(axes, models, strict=True):
        names = [s["name"] for s in model["servers"]]
        width = 0.8 / len(CLIENTS)
        for k, client in enumerate(CLIENTS):
            xs = [i + (k - 1) * width for i in range(len(names))]
            rows = [s["clients"][client] for s in model["servers"]]
            ax_tok.bar(xs, [r["output_tokens_per_s"] for r in rows], width, label=client)
            ax_tpot.bar(xs, [r["tpot_p99_s"] * 1e3 for r in rows], width, label=client)
        for ax, title in ((ax_tok, "output tok/s (median)"), (ax_tpot, "TPOT P99, ms (median)")):
            ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
            ax.set_title(f"{model['model']}: {title}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny"])
    parser.add_argument("--servers", nargs="+", default=["vllm", *(c.name for c in WOK_CONFIGS)])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--vllm-venv", default=str(default_venv()))
    parser.add_argument("--out", default=str(RESULTS / "client_agreement"))
    parser.add_argument("--logs", default=None, help="keep the servers' and clients' logs here")
    args = parser.parse_args(argv)
    vllm_python = ensure_vllm(Path(args.vllm_venv))
    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work, "
        f"load average {os.getloadavg()[0]:.1f} at start",
        "command": shlex.join(["python", "bench/vllm/client_agreement.py", *sys.argv[1:]]),
        "vllm": vllm_version(vllm_python),
        "reps": args.reps,
        "requests": args.requests,
        "models": [],
    }
    with tempfile.TemporaryDirectory(prefix="wok-clients-") as scratch:
        logs = args.logs or scratch
        Path(logs).mkdir(parents=True, exist_ok=True)
        vllm = VllmBenchClient(vllm_python, Path(logs))
        try:
            for name in args.models:
                model = bench_model(
                    name, vllm_python=vllm_python, vllm=vllm, args=args, logs=Path(logs)
                )
                report["models"].append(model)
        finally:
            vllm.close()
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    plot(report, out.with_suffix(".png"))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
