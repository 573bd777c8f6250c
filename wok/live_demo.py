"""The live part of `wok demo`: a real runtime process, a real burst of requests, and the control
law moving the live batch size through the admin API, one tick a second.

No cluster: one replica, so only the batch knob moves. The law is the operator's own `decide`;
the signals are read from the runtime's /metrics exactly as Prometheus would scrape them.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from wok_contracts.signals import Observation
from wok_operator.control import LawParams, LoopState, decide

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PARAMS = LawParams(
    batch_min=1,
    batch_max=24,
    batch_mem=24,
    batch_step=2,
    replicas_min=1,
    replicas_max=1,
    replicas_max_step=1,
    target_queue=2.0,
    deadband=1.0,
    target_utilization=0.6,
    slo_ttft_s=60.0,
    slo_tpot_s=1.0,
    slo_e2e_s=None,
    kv_usage_ceiling=0.95,
    scale_up_window_s=2.0,
    scale_down_window_s=6.0,
    slo_window_s=10.0,
    pod_start_s=0.0,
)


@dataclass(frozen=True)
class Tick:
    t: float
    waiting: float
    running: float
    batch: int
    reason: str


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (
                "vllm:num_requests_waiting",
                "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc",
                "wok_max_batch_size",
            ):
                values[sample.name] = sample.value
            # The law's throughput inputs: completions and rejections, summed over labels.
            elif sample.name in ("vllm:request_success_total", "wok_rejected_requests_total"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def per_s(
    name: str, before: tuple[float, dict[str, float]] | None, after: tuple[float, dict[str, float]]
) -> float | None:
    """A counter's rate between two scrapes; None before the second, as Prometheus' rate()."""
    if before is None or name not in before[1] or name not in after[1]:
        return None
    return (after[1][name] - before[1][name]) / (after[0] - before[0])


def burst(url: str, stop: threading.Event, clients: int) -> None:
    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                http.post(
                    f"{url}/v1/completions",
                    json={
                        "model": "tiny",
                        "prompt": "the wok",
                        "max_tokens": 96,
                        "ignore_eos": True,
                    },
                )

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(timeout=60)


def run_live(out: Path, *, busy_s: float = 20.0, quiet_s: float = 16.0) -> list[Tick]:
    port = 18000 + secrets.randbelow(2000)
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        token = secrets.token_urlsafe(16)
        (Path(tmp) / "token").write_text(token)
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wok.cli",
                "runtime",
                "serve",
                "--model=builtin:tiny",
                "--served-model-name=tiny",
                f"--port={port}",
                "--max-batch-size=2",
                "--kv-cache-bytes=32000000",
                "--max-model-len=512",
                "--max-queue=256",
                f"--admin-token-file={tmp}/token",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None:
                    raise RuntimeError("the runtime exited before it was ready")
                time.sleep(0.5)
            return _loop(url, token, busy_s, quiet_s)
        finally:
            server.terminate()
            server.wait(timeout=60)


def _loop(url: str, token: str, busy_s: float, quiet_s: float) -> list[Tick]:
    stop = threading.Event()
    load = threading.Thread(target=burst, args=(url, stop, 32), daemon=True)
    load.start()
    state = LoopState(batch=2, replicas=1)
    ticks: list[Tick] = []
    start = time.monotonic()
    last: tuple[float, dict[str, float]] | None = None
    while (now := time.monotonic() - start) < busy_s + quiet_s:
        if now >= busy_s and not stop.is_set():
            stop.set()
            print(f"{now:5.1f}s  the burst ends")
        m = scrape(url)
        obs = Observation(
            queue_per_replica=m.get("vllm:num_requests_waiting"),
            kv_usage=m.get("vllm:kv_cache_usage_perc"),
            ready_replicas=1,
            pending_replicas=0,
            running_per_replica=m.get("vllm:num_requests_running"),
            finished_per_s=per_s("vllm:request_success_total", last, (now, m)),
            rejected_per_s=per_s("wok_rejected_requests_total", last, (now, m)),
        )
        last = (now, m)
        decision = decide(state, obs, PARAMS, now=now)
        if decision.batch != state.batch:
            httpx.put(
                f"{url}/admin/v1/batching",
                json={"max_batch_size": decision.batch},
                headers={"Authorization": f"Bearer {token}"},
                timeout=5,
            ).raise_for_status()
            print(f"{now:5.1f}s  {decision.reason}")
        ticks.append(
            Tick(
                now,
                obs.queue_per_replica or 0.0,
                m.get("vllm:num_requests_running", 0),
                decision.batch,
                decision.reason,
            )
        )
        state = decision.state
        time.sleep(1.0)
    stop.set()
    load.join(timeout=90)
    return ticks


def live_figure(ticks: list[Tick]) -> Figure:
    """The queue, the running set and the live batch size over the run, with the ceiling the
    batch may not pass (the README's min(B_max, B_mem)): while the running set sits at that cap,
    the rest wait, and only more replicas (none here: one pod) could drain the queue faster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [tick.t for tick in ticks]
    cap = min(PARAMS.batch_max, PARAMS.batch_mem)
    fig, ax = plt.subplots(figsize=(13, 4))
    ax.plot(t, [tick.waiting for tick in ticks], label="waiting requests (queue)")
    ax.plot(t, [tick.running for tick in ticks], label="running requests")
    ax.step(t, [tick.batch for tick in ticks], where="post", label="max batch size (live cap)")
    ax.axhline(
        cap,
        color="tab:red",
        linestyle="--",
        linewidth=1,
        label=f"batch ceiling {cap} (min(B_max, B_mem)):\nat it, the rest wait in the queue",
    )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests (one pod)")
    ax.set_title("wok, live: a real runtime under a burst, its batch moved by the control law")
    # Beside the axes, not on them: the running set sits at the ceiling in the upper half.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    return fig


def plot_live(ticks: list[Tick], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = live_figure(ticks)
    fig.savefig(path, dpi=110)
    plt.close(fig)
