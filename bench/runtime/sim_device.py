"""What a simulated-accelerator pod costs, and whether it keeps the profile's pace.

Why: the emulated cluster runs 20-50 `wok runtime serve --device sim` pods on one small machine,
so each must cost little CPU and memory (the targets: < 3 % of a core at 20 req/s,
< 150 MB RSS), and its measured throughput must be the profile's prediction, or every fleet-scale
result would be off by the difference.

Three parts, each against a real server process on loopback:

- `idle`: a ready pod scraped every 5 s (as Prometheus would) and nothing else.
- `load`: Poisson arrivals at `--rate` for `--seconds` with the fleet simulator's default lengths
  (`wok_contracts.traces.poisson`: exponential, mean prompt 512 and output 128 tokens; the Azure
  code trace's 2,048-token mean prompt would need 1.6 s of prefill a second at 20 req/s, more than
  one such GPU has), token-id prompts and `ignore_eos` (exact lengths), non-streamed and streamed.
  The server's CPU comes from /proc/PID/stat (user + system) over the run; RSS is VmRSS at the
  end and VmHWM.
- `pace`: a closed loop of exactly B clients at batch cap B (fixed prompt and output lengths).
  The profile's time for the steps the server really ran (its own step counters) is compared with
  the wall time they took, and the server's CPU per step is given beside it.

    .venv/bin/python bench/runtime/sim_device.py --json bench/runtime/results/sim_device.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from wok_contracts.profile import StepProfile, load_profile
from wok_contracts.traces import clip_to_model, poisson
from wok_runtime.tools.bench_http import PROMPT_TOKEN_RANGE

ROOT = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")
NAME = "sim"


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str

    def cpu_seconds(self, task: int | None = None) -> float:
        """User + system CPU of the process, or of one of its threads (`task`)."""
        path = f"/proc/{self.proc.pid}" + ("" if task is None else f"/task/{task}")
        fields = Path(f"{path}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def main_thread_cpu_seconds(self) -> float:
        """The event loop's thread (the engine runs in the only other one)."""
        return self.cpu_seconds(self.proc.pid)

    def memory_mb(self) -> dict[str, float]:
        status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        values = {line.split(":")[0]: int(line.split()[1]) for line in status if line[:2] == "Vm"}
        return {"rss_mb": values["VmRSS"] / 1024, "peak_rss_mb": values["VmHWM"] / 1024}

    def counters(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def start(profile: str, max_batch_size: int, port: int, *extra: str) -> Server:
    argv = [
        sys.executable, "-m", "wok.cli", "runtime", "serve", "--device", "sim",
        "--profile", profile, "--sim-load-seconds", "0", "--served-model-name", NAME,
        "--max-batch-size", str(max_batch_size), "--max-queue", "4096",
        "--port", str(port), "--log-level", "warning", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT)
    server = Server(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError("the sim server was not ready within 120 s")


def steps(server: Server) -> float:
    return server.counters()[f'wok_batch_size_count{{model_name="{NAME}"}}']


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(*PROMPT_TOKEN_RANGE) for _ in range(n)]


async def send(http: httpx.AsyncClient, url: str, ids: list[int], out: int, stream: bool) -> int:
    """The answer's status; 0 for no answer (counted, not raised)."""
    body = {"prompt": ids, "max_tokens": out, "ignore_eos": True, "stream": stream}
    try:
        if not stream:
            return (await http.post(f"{url}/v1/completions", json=body)).status_code
        async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            async for _ in r.aiter_lines():
                pass
            return r.status_code
    except httpx.HTTPError:
        return 0


# Below uvicorn's 5 s keep-alive: a connection the server is closing is never reused.
LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=1.0)


def run_idle(ref: str, *, seconds: float, port: int) -> dict[str, Any]:
    server = start(ref, 256, port)
    try:
        before, wall0 = server.cpu_seconds(), time.monotonic()
        while time.monotonic() < wall0 + seconds:
            server.counters()
            time.sleep(5)
        cpu, wall = server.cpu_seconds() - before, time.monotonic() - wall0
        return {"wall_s": wall, "server_cpu_percent_of_one_core": 100 * cpu / wall,
                **server.memory_mb()}  # fmt: skip
    finally:
        server.stop()


def run_load(
    profile: StepProfile,
    ref: str,
    *,
    rate: float,
    seconds: float,
    stream: bool,
    port: int,
    stream_interval: int = 1,
) -> dict[str, Any]:
    rng = random.Random(0)
    arrivals, _ = clip_to_model(poisson(rate, seconds, seed=0), profile.max_model_len)
    server = start(ref, 256, port, "--stream-interval", str(stream_interval))
    try:
        statuses: dict[int, int] = {}
        client_cpu0 = time.process_time()

        async def main() -> None:
            async with httpx.AsyncClient(timeout=300, limits=LIMITS) as http:
                tasks = []
                t0 = time.monotonic()
                for row in arrivals:
                    delay = t0 + row.arrival_s - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    ids = prompt(rng, row.prompt_tokens)
                    tasks.append(asyncio.create_task(
                        send(http, server.url, ids, row.output_tokens, stream)))  # fmt: skip
                for status in await asyncio.gather(*tasks):
                    statuses[status] = statuses.get(status, 0) + 1

        before, wall0 = server.cpu_seconds(), time.monotonic()
        main_before, steps_before = server.main_thread_cpu_seconds(), steps(server)
        asyncio.run(main())
        cpu, wall = server.cpu_seconds() - before, time.monotonic() - wall0
        main_cpu, engine_steps = (
            server.main_thread_cpu_seconds() - main_before,
            steps(server) - steps_before,
        )
        requests = sum(statuses.values())
        return {
            "stream": stream,
            "stream_interval": stream_interval,
            "offered_rate_per_s": rate,
            "achieved_rate_per_s": requests / wall,
            "requests": requests,
            "statuses": statuses,
            "wall_s": wall,
            "server_cpu_s": cpu,
            "server_cpu_percent_of_one_core": 100 * cpu / wall,
            "event_loop_cpu_ms_per_request": 1000 * main_cpu / requests,
            "engine_steps": engine_steps,
            "engine_thread_cpu_ms_per_step": 1000 * (cpu - main_cpu) / engine_steps,
            "client_cpu_percent_of_one_core": 100 * (time.process_time() - client_cpu0) / wall,
            **server.memory_mb(),
        }
    finally:
        server.stop()


def run_pace(
    profile: StepProfile,
    ref: str,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    seconds: float,
    port: int,
) -> dict[str, Any]:
    server = start(ref, batch, port)
    rng = random.Random(batch)
    try:

        async def client(http: httpx.AsyncClient, stop_at: float) -> None:
            while time.monotonic() < stop_at:
                await send(http, server.url, prompt(rng, prompt_len), output_len, False)

        async def main(window: float) -> None:
            async with httpx.AsyncClient(timeout=300, limits=LIMITS) as http:
                await asyncio.gather(
                    *(client(http, time.monotonic() + window) for _ in range(batch))
                )

        # The window is measured in the middle of the run: every client is busy throughout.
        async def measured() -> tuple[dict[str, float], dict[str, float], float, float]:
            load = asyncio.create_task(main(seconds + 10))
            await asyncio.sleep(5)
            first, t0, cpu0 = server.counters(), time.monotonic(), server.cpu_seconds()
            await asyncio.sleep(seconds)
            last, t1, cpu1 = server.counters(), time.monotonic(), server.cpu_seconds()
            await load
            return first, last, t1 - t0, cpu1 - cpu0

        first, last, wall, cpu = asyncio.run(measured())
    finally:
        server.stop()

    def delta(key: str) -> float:
        return last[key] - first[key]

    label = f'{{model_name="{NAME}"}}'
    steps = delta(f"wok_batch_size_count{label}")
    seq_steps = delta(f"wok_batch_size_sum{label}")
    # Every scheduled sequence samples one token (a prompt that divides the step budget is never
    # chunked); the token counter itself moves only when non-streamed answers finish.
    tokens = seq_steps
    # Per request: one prefill of the prompt (its first token), then output_len - 1 decodes, the
    # k-th reading prompt_len + k tokens of context.
    requests = tokens / output_len
    predicted = (
        steps * profile.a_s
        + profile.b_s_per_seq * requests * (output_len - 1)
        + profile.c_s_per_prefill_token * requests * prompt_len
        + profile.d_s_per_context_token * tokens * (prompt_len + (output_len - 1) / 2)
    )
    return {
        "batch_cap": batch,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "window_s": wall,
        "steps": steps,
        "mean_batch": seq_steps / steps,
        "output_tokens_per_s": tokens / wall,
        "predicted_output_tokens_per_s": tokens / predicted,
        "measured_over_predicted_time": wall / predicted,
        "unexplained_ms_per_step": 1000 * (wall - predicted) / steps,
        "server_cpu_ms_per_step": 1000 * cpu / steps,
        "profile_ms_per_step": 1000 * predicted / steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="sim:llama-3-8b-80g")
    parser.add_argument("--rates", type=float, nargs="+", default=[20.0])
    parser.add_argument("--seconds", type=float, default=60.0, help="load run length")
    parser.add_argument("--pace-seconds", type=float, default=20.0, help="pace window length")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--prompt-len", type=int, default=512, help="divides the step budget")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument(
        "--stream-interval", type=int, default=8, help="also streamed with this interval"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report: dict[str, Any] = {"profile": args.profile, "started": started, "load": [], "pace": []}
    report["idle"] = run_idle(args.profile, seconds=30, port=args.port)
    print(json.dumps(report["idle"]), flush=True)
    variants = [(False, 1), (True, 1), (True, args.stream_interval)]
    for rate in args.rates:
        for stream, interval in variants:
            result = run_load(
                profile, args.profile, rate=rate, seconds=args.seconds, stream=stream,
                port=args.port, stream_interval=interval,
            )  # fmt: skip
            result["load_average_1m"] = os.getloadavg()[0]  # the machine is shared
            report["load"].append(result)
            print(json.dumps(result), flush=True)
    for batch in args.batches:
        result = run_pace(
            profile,
            args.profile,
            batch=batch,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            seconds=args.pace_seconds,
            port=args.port,
        )
        result["load_average_1m"] = os.getloadavg()[0]
        report["pace"].append(result)
        print(json.dumps(result), flush=True)
    report["load_average_at_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
