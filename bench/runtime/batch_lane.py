"""Does the batch lane keep out of the online lane's way, and does it fill the idle capacity?

Why: the batch lane promises that an offline backlog costs the online traffic nothing
(no 429s, its P99 within 1.2x of alone) while it uses the capacity the online traffic leaves
idle (at least 60 % of it). For each `--devices` entry one real `wok runtime serve` process on
loopback: `cpu` runs builtin:tiny on the CPU (the real model; a step's cost grows with every
sequence in it), `sim` the simulated accelerator with a GPU profile (`--profile`; a decode step
costs about the same for 2 sequences as for 8, as on a GPU). Three phases each:

- `capacity`: a closed loop of 2 x `--max-batch-size` online clients for `--capacity-seconds`;
  the server's own generated-token counter over that time is the online lane's capacity C.
- `alone`: Poisson online arrivals at `--load` x C (in output tokens) for `--seconds`, fixed
  lengths, non-streamed (E2E as the client sees it; TTFT and TPOT from the server's histograms).
- `with backlog`: the same arrivals (same seed) while `--batch-clients` closed-loop clients keep
  the batch lane saturated (`"priority": "batch"`, non-streamed, honouring 429 Retry-After),
  started `--warmup-seconds` before the online load. The batch tokens are the server's
  `wok_batch_lane_generation_tokens_total` over the online window; the idle capacity is
  (C - the online token rate alone) x that window.

    .venv/bin/python bench/runtime/batch_lane.py --devices cpu sim \
        --md bench/runtime/results/batch_lane.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_device import Server  # its /metrics counters and stop()

from wok_contracts.traces import TraceRequest, uniform_poisson
from wok_runtime.tools.bench_http import PROMPT_TOKEN_RANGE, RequestResult, summarize

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bench"  # the served model name on both devices
LABEL = f'{{model_name="{MODEL}"}}'
ONLINE_TOKENS = f"vllm:generation_tokens_total{LABEL}"
BATCH_TOKENS = f"wok_batch_lane_generation_tokens_total{LABEL}"
BATCH_PREEMPTIONS = f"wok_batch_lane_preemptions_total{LABEL}"
ONLINE_PREEMPTIONS = f"vllm:num_preemptions_total{LABEL}"
ONLINE_REJECTED = f'wok_rejected_requests_total{{model_name="{MODEL}",reason="queue_full"}}'
P99_GOAL = 1.2  # online P99 E2E with the backlog / alone
IDLE_USE_GOAL = 0.6  # batch tokens / the idle capacity


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def device_flags(device: str, args: argparse.Namespace) -> list[str]:
    if device == "sim":
        return ["--device", "sim", "--profile", args.profile, "--sim-load-seconds", "0"]
    return ["--model", "builtin:tiny", "--device", "cpu",
            "--kv-cache-bytes", str(args.kv_cache_bytes), "--max-model-len", "512"]  # fmt: skip


def start(device: str, args: argparse.Namespace) -> Server:
    port = free_port()
    argv = [
        sys.executable, "-m", "wok.cli", "runtime", "serve", *device_flags(device, args),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "warning", "--max-batch-size", str(args.max_batch_size),
        "--max-queue", "1024", "--batch-queue-size", "1024",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "WOK_ADMIN_TOKEN"}
    # One torch thread: on 2 shared cores the client and the server's event loop need the other,
    # and an oversubscribed torch pool makes a step 10-30x slower at random.
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(argv, cwd=ROOT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError("the server was not ready within 180 s")


def _body(prompt: int, output: int, rng: random.Random, **extra: Any) -> dict[str, Any]:
    ids = [rng.randrange(*PROMPT_TOKEN_RANGE) for _ in range(prompt)]
    return {"prompt": ids, "max_tokens": output, "ignore_eos": True, **extra}


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> RequestResult:
    """One non-streamed completion, timed on the client (a streamed one would cost this 2-core
    machine a Python-level event per token on both sides)."""
    result = RequestResult(expected_tokens=body["max_tokens"])
    started = time.perf_counter()
    try:
        r = await http.post(f"{url}/v1/completions", json=body)
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
        return result
    result.status = r.status_code
    result.e2e_s = time.perf_counter() - started
    if r.status_code == 200:
        result.output_tokens = r.json()["usage"]["completion_tokens"]
    else:
        result.error = r.headers.get("retry-after", "")
    return result


class ClosedLoop:
    """`clients` clients that each send their next request as soon as the last one is answered
    (after Retry-After on a 429), until stopped; closing their connections aborts the rest."""

    def __init__(self, url: str, *, clients: int, prompt: int, output: int, seed: int,
                 **extra: Any) -> None:  # fmt: skip
        self.url, self.clients, self.prompt, self.output = url, clients, prompt, output
        self.extra = extra
        self.rng = random.Random(seed)
        self.stopping = asyncio.Event()
        self.statuses: dict[int, int] = {}

    async def _client(self, http: httpx.AsyncClient) -> None:
        while not self.stopping.is_set():
            body = _body(self.prompt, self.output, self.rng, **self.extra)
            result = await _post(http, self.url, body)
            self.statuses[result.status] = self.statuses.get(result.status, 0) + 1
            if result.status == 429:
                await asyncio.sleep(float(result.error or 1))
            elif result.status != 200:
                await asyncio.sleep(0.5)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(limits=limits, timeout=600) as http:
            tasks = [asyncio.create_task(self._client(http)) for _ in range(self.clients)]
            await self.stopping.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _open_loop(
    url: str, specs: list[TraceRequest], *, seed: int, progress: bool
) -> tuple[list[RequestResult], float]:
    """The online load: each request sent at its time, whatever the others do."""
    rng = random.Random(seed)
    bodies = [_body(s.prompt_tokens, s.output_tokens, rng) for s in specs]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(specs), desc="online", unit="req", file=sys.stderr)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(limits=limits, timeout=600) as http:
        start = time.perf_counter()

        async def send(spec: TraceRequest, body: dict[str, Any]) -> RequestResult:
            await asyncio.sleep(max(0.0, spec.arrival_s - (time.perf_counter() - start)))
            result = await _post(http, url, body)
            if bar is not None:
                bar.update(1)
            return result

        results = await asyncio.gather(*(send(s, b) for s, b in zip(specs, bodies, strict=True)))
        elapsed = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return list(results), elapsed


def capacity(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """Output tokens per second of a saturated online lane at --max-batch-size."""

    async def main() -> None:
        loop = ClosedLoop(server.url, clients=2 * args.max_batch_size, prompt=args.online_prompt,
                          output=args.online_output, seed=1)  # fmt: skip
        runner = asyncio.create_task(loop.run())
        await asyncio.sleep(args.capacity_seconds)
        loop.stopping.set()
        await runner

    before, t0 = server.counters(), time.monotonic()
    asyncio.run(main())
    wall = time.monotonic() - t0
    tokens = server.counters()[ONLINE_TOKENS] - before[ONLINE_TOKENS]
    return {"seconds": wall, "tokens": tokens, "tokens_per_s": tokens / wall}


def online_phase(
    server: Server, args: argparse.Namespace, rate: float, *, backlog: bool
) -> dict[str, Any]:
    """The online load (and, with `backlog`, the batch clients around it)."""
    n = max(1, round(rate * args.seconds))
    specs = uniform_poisson(
        n,
        rate=rate,
        prompt_tokens=(args.online_prompt, args.online_prompt),
        output_tokens=(args.online_output, args.online_output),
        seed=args.seed,
    )

    async def main() -> tuple[list[RequestResult], float, dict, dict, dict[int, int]]:
        batch = ClosedLoop(
            server.url,
            clients=args.batch_clients,
            prompt=args.batch_prompt,
            output=args.batch_output,
            seed=args.seed + 1,
            priority="batch",
        )
        runner = asyncio.create_task(batch.run()) if backlog else None
        if backlog:
            await asyncio.sleep(args.warmup_seconds)  # a backlog already waiting
        before = await asyncio.to_thread(server.counters)
        results, elapsed = await _open_loop(
            server.url, specs, seed=args.seed, progress=not args.no_progress
        )
        after = await asyncio.to_thread(server.counters)
        if runner is not None:
            batch.stopping.set()
            await runner
        return results, elapsed, before, after, batch.statuses

    results, elapsed, before, after, statuses = asyncio.run(main())

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    def mean(histogram: str) -> float | None:
        count = delta(f"{histogram}_count{LABEL}")
        return delta(f"{histogram}_sum{LABEL}") / count if count else None

    steps = delta(f"wok_batch_size_count{LABEL}")
    return {
        "rate_per_s": rate,
        "window_s": elapsed,
        "online": summarize(results, elapsed, mean_batch_size=None),
        "online_ttft_mean_s": mean("vllm:time_to_first_token_seconds"),
        "online_tpot_mean_s": mean("vllm:request_time_per_output_token_seconds"),
        "mean_batch_size": delta(f"wok_batch_size_sum{LABEL}") / steps if steps else None,
        "online_tokens_per_s": delta(ONLINE_TOKENS) / elapsed,
        "online_queue_full_total": delta(ONLINE_REJECTED),
        "online_preemptions": delta(ONLINE_PREEMPTIONS),
        "batch_tokens": delta(BATCH_TOKENS),
        "batch_preemptions": delta(BATCH_PREEMPTIONS),
        "batch_statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def section(result: dict[str, Any]) -> str:
    cap, alone, mixed = result["capacity"], result["alone"], result["with_backlog"]
    a, m = alone["online"], mixed["online"]
    ratio, use = result["p99_ratio"], result["idle_capacity_used"]
    online_429 = m["rejected"] + mixed["online_queue_full_total"]

    def ms(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{1000 * value:.{digits}f} ms"

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    p = result["params"]
    rows = [
        ("online requests answered", f"{a['completed']}/{a['num_requests']}",
         f"{m['completed']}/{m['num_requests']}"),
        ("online 429s", str(a["rejected"]), str(m["rejected"])),
        ("online E2E P50", ms(a["e2e_p50_s"]), ms(m["e2e_p50_s"])),
        ("online E2E P99", ms(a["e2e_p99_s"]), ms(m["e2e_p99_s"])),
        ("online TTFT mean (server)", ms(alone["online_ttft_mean_s"]),
         ms(mixed["online_ttft_mean_s"])),
        ("online TPOT mean (server)", ms(alone["online_tpot_mean_s"], 1),
         ms(mixed["online_tpot_mean_s"], 1)),
        ("online tokens/s", f"{alone['online_tokens_per_s']:.0f}",
         f"{mixed['online_tokens_per_s']:.0f}"),
        ("batch tokens/s", "-", f"{mixed['batch_tokens'] / mixed['window_s']:.0f}"),
        ("mean sequences per step", f"{alone['mean_batch_size']:.2f}",
         f"{mixed['mean_batch_size']:.2f}"),
        ("online preemptions", f"{alone['online_preemptions']:.0f}",
         f"{mixed['online_preemptions']:.0f}"),
        ("batch preemptions", "-", f"{mixed['batch_preemptions']:.0f}"),
        ("window", f"{alone['window_s']:.1f} s", f"{mixed['window_s']:.1f} s"),
    ]  # fmt: skip
    table = "\n".join(f"| {name} | {x} | {y} |" for name, x, y in rows)
    idle_tokens = result["idle_capacity_tokens"]
    batch_tokens = mixed["batch_tokens"]
    goals = "\n".join(
        f"| {goal} | {figure} | {verdict(ok)} |"
        for goal, figure, ok in [
            (f"online P99 E2E with the backlog ≤ {P99_GOAL}× alone", f"{ratio:.2f}×",
             ratio <= P99_GOAL),
            ("online 429s with the backlog = 0", f"{online_429:.0f}", online_429 == 0),
            (f"batch tokens ≥ {IDLE_USE_GOAL:.0%} of the idle capacity",
             f"{batch_tokens:.0f} of {idle_tokens:.0f} = {use:.0%}", use >= IDLE_USE_GOAL),
        ]
    )  # fmt: skip
    flags = " ".join(device_flags(result["device"], argparse.Namespace(**p)))
    return f"""## `{result["device"]}`: `{flags}`

`--max-batch-size {p["max_batch_size"]}`, the batch lane's defaults otherwise. 1-minute load
average at the end: {result["loadavg_end"]:.1f}.

- Capacity C (online lane saturated, {2 * p["max_batch_size"]} closed-loop clients,
  {cap["seconds"]:.0f} s): **{cap["tokens_per_s"]:.0f} output tokens/s**.
- Online load: Poisson at {alone["rate_per_s"]:.2f} req/s = {p["load"]:.0%} of C, for
  {p["seconds"]:.0f} s, the same arrival times in both runs.

| | online alone | online + batch backlog |
|---|---|---|
{table}

Against the goals:

| goal | figure | |
|---|---|---|
{goals}

The idle capacity is (C − the online token rate alone) × the window with the backlog. Batch
requests answered during the run, by status: {mixed["batch_statuses"]} (cut-off ones at the end
are aborted by the client, status 0 is not counted there).
"""


def header(args: argparse.Namespace, command: str, started: str) -> str:
    return f"""# The batch lane: isolation of the online lane, use of the idle capacity

Command (the shared 2-core machine, started {started}):

```
{command}
```

Each device: one real `wok runtime serve` process on 127.0.0.1 (`OMP_NUM_THREADS=1`: the client
and the server's event loop need the other core). Online requests: {args.online_prompt} prompt
tokens, {args.online_output} output tokens, non-streamed, Poisson arrivals; batch requests:
{args.batch_prompt} prompt and {args.batch_output} output tokens, non-streamed,
`"priority": "batch"`, from {args.batch_clients} closed-loop clients started
{args.warmup_seconds:.0f} s before the online load.
"""


def run_device(device: str, args: argparse.Namespace) -> dict[str, Any]:
    server = start(device, args)
    try:
        print(f"{device}: capacity…", file=sys.stderr)
        cap = capacity(server, args)
        rate = args.load * cap["tokens_per_s"] / args.online_output
        print(
            f"{device}: C = {cap['tokens_per_s']:.0f} tok/s; online at {rate:.2f} req/s",
            file=sys.stderr,
        )
        alone = online_phase(server, args, rate, backlog=False)
        print(f"{device}: online + batch backlog", file=sys.stderr)
        mixed = online_phase(server, args, rate, backlog=True)
    finally:
        server.stop()
    idle = max(0.0, cap["tokens_per_s"] - alone["online_tokens_per_s"]) * mixed["window_s"]
    return {
        "device": device,
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "capacity": cap,
        "alone": alone,
        "with_backlog": mixed,
        "p99_ratio": mixed["online"]["e2e_p99_s"] / alone["online"]["e2e_p99_s"],
        "idle_capacity_tokens": idle,
        "idle_capacity_used": mixed["batch_tokens"] / idle if idle > 0 else float("nan"),
        "loadavg_end": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", nargs="+", choices=("cpu", "sim"), default=["cpu", "sim"])
    parser.add_argument("--profile", default="sim:llama-3-8b-80g", help="the sim device's")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--kv-cache-bytes", type=int, default=64_000_000)
    parser.add_argument("--load", type=float, default=0.6, help="online load, fraction of C")
    parser.add_argument("--seconds", type=float, default=40.0, help="online load duration")
    parser.add_argument("--capacity-seconds", type=float, default=15.0)
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--online-prompt", type=int, default=64)
    parser.add_argument("--online-output", type=int, default=64)
    parser.add_argument("--batch-prompt", type=int, default=128)
    parser.add_argument("--batch-output", type=int, default=128)
    parser.add_argument("--batch-clients", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--md", type=Path, default=None, help="write the report here")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    if not 0 < args.load < 1:
        parser.error("--load must be in (0, 1)")
    if not 0 < args.seconds <= 600 or not 0 < args.capacity_seconds <= 120:
        parser.error("--seconds must be in (0, 600] and --capacity-seconds in (0, 120]")
    command = shlex.join([".venv/bin/python", *sys.argv]).replace(f"{ROOT}/", "")
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = [run_device(device, args) for device in args.devices]
    text = "\n".join([header(args, command, started), *(section(r) for r in results)])
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
