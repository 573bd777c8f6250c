"""A metrics source for many emulated pods: one process that answers, on every emulated (KWOK)
runtime pod's own IP and port, what a runtime pod would: /metrics with every series of the
runtime's metric contract (`wok_contracts.metrics.METRICS`), and the admin batch-size PUT.

Why: a thousand real runtime processes do not fit a 2-core machine, and a scale benchmark of the
operator needs the usual query path: Prometheus finds the pods through Kubernetes discovery,
scrapes `podIP:8000/metrics` and labels each series with namespace, pod and service itself
(`wok_cluster.prometheus.scrape_config`), and the operator pushes batch sizes to the pod IPs. The
pod network is 127.x.0.0/16, so one process can listen on every pod's address.

The series move with time: each service has its own load, a sine around its base rate with its
own period and phase; counters integrate it, histograms grow with a fixed shape per metric
(log-normal around a median), gauges follow it (running = rate × 4 s, Little's law).

    .venv/bin/python bench/operator/emulated_pod_metrics.py --kubeconfig KC --namespace NS
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parents[1] / "cluster")]

from wok_cluster.kubeapi import KubeApi  # noqa: E402
from wok_contracts.metrics import METRICS, MODEL_LABEL, MetricSpec  # noqa: E402
from wok_operator.actuate import ADMIN_PATH  # noqa: E402
from wok_operator.resources import MANAGED_BY, RUNTIME_PORT, SERVICE_LABEL  # noqa: E402

LATENCY_S = 4.0  # a request's mean time in the pod (running = rate × this)
# Per metric: how many observations (histograms) or units (counters) each request brings, and
# a histogram's median observation; the rest get one per request and their buckets' middle.
PER_REQUEST = {
    "vllm:prompt_tokens": 500.0,
    "vllm:generation_tokens": 200.0,
    "vllm:inter_token_latency_seconds": 200.0,
    "wok_batch_size": 200.0,
    "wok_rejected_requests": 0.002,
    "vllm:num_preemptions": 0.001,
}
MEDIAN = {
    "vllm:time_to_first_token_seconds": 0.15,
    "vllm:inter_token_latency_seconds": 0.02,
    "vllm:request_time_per_output_token_seconds": 0.02,
    "vllm:e2e_request_latency_seconds": LATENCY_S,
    "vllm:request_inference_time_seconds": LATENCY_S - 0.2,
    "vllm:request_queue_time_seconds": 0.05,
}
LABEL_VALUES = {
    "finished_reason": ("stop",),
    "reason": ("queue_full",),
    "priority": ("0",),
    "state": ("free", "used"),
    "device": ("cuda",),
}


def normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass
class Load:
    """One service's request rate over time: base × (1 + 0.5 sin(2πt/period + phase))."""

    base: float
    period_s: float
    phase: float

    def rate(self, t: float) -> float:
        return self.base * (1.0 + 0.5 * math.sin(2 * math.pi * t / self.period_s + self.phase))

    def requests(self, t: float) -> float:
        """∫₀ᵗ rate: the requests served by time t (a counter's value)."""
        w = 2 * math.pi / self.period_s
        return self.base * (t + 0.5 / w * (math.cos(self.phase) - math.cos(w * t + self.phase)))


@dataclass
class Pod:
    name: str
    ip: str
    load: Load
    batch: int = 32
    server: asyncio.Server | None = None


def sample_lines(spec: MetricSpec, pod: Pod, t: float) -> list[str]:
    base = f'{MODEL_LABEL}="model"'
    label_sets = [base]
    for label in spec.labels:
        label_sets = [f'{s},{label}="{v}"' for s in label_sets for v in LABEL_VALUES[label]]
    requests = pod.load.requests(t)
    running = pod.load.rate(t) * LATENCY_S
    lines = [f"# TYPE {spec.name} {spec.kind}"]
    for labels in label_sets:
        if spec.kind == "counter":
            value = requests * PER_REQUEST.get(spec.name, 1.0)
            if spec.name.startswith("wok_batch_lane"):
                value = 0.0
            lines.append(f"{spec.name}_total{{{labels}}} {value:.3f}")
        elif spec.kind == "histogram":
            count = math.floor(requests * PER_REQUEST.get(spec.name, 1.0))
            lo, hi = spec.buckets[0], spec.buckets[-1]
            median = MEDIAN.get(spec.name, math.sqrt(lo * hi) if lo > 0 else hi / 2)
            for le in spec.buckets:
                share = normal_cdf(math.log(le / median) / 0.6) if le > 0 else 0.0
                lines.append(
                    f'{spec.name}_bucket{{{labels},le="{le:g}"}} {math.floor(count * share)}'
                )
            lines.append(f'{spec.name}_bucket{{{labels},le="+Inf"}} {count}')
            lines.append(f"{spec.name}_sum{{{labels}}} {count * median * 1.2:.3f}")
            lines.append(f"{spec.name}_count{{{labels}}} {count}")
        else:
            lines.append(f"{spec.name}{{{labels}}} {gauge(spec.name, pod, running):.4f}")
    return lines


def gauge(name: str, pod: Pod, running: float) -> float:
    running_now = min(running, pod.batch)
    if name in ("vllm:num_requests_waiting", "wok_queue_length"):
        return max(0.0, running - pod.batch)
    if name in ("vllm:num_requests_running", "wok_batch_size"):
        return running_now
    if name == "vllm:kv_cache_usage_perc":
        return min(1.0, running_now / 64)
    if name == "wok_max_batch_size":
        return pod.batch
    if name == "wok_kv_cache_budget_bytes":
        return 40e9
    if name == "wok_kv_cache_measured_bytes":
        return 41e9
    if name == "wok_kv_cache_blocks":
        return 1000.0
    return 0.0  # the batch lane's: no offline work here


def metrics_page(pod: Pod, t: float) -> bytes:
    lines: list[str] = []
    for spec in METRICS.values():
        lines += sample_lines(spec, pod, t)
    return ("\n".join(lines) + "\n").encode()


@dataclass
class Source:
    """Every emulated pod of one namespace, each served on its own IP."""

    api: KubeApi
    namespace: str
    seed: int = 0
    started: float = field(default_factory=time.monotonic)
    pods: dict[str, Pod] = field(default_factory=dict)  # by pod IP
    loads: dict[str, Load] = field(default_factory=dict)  # by service
    scrapes: int = 0

    def load_of(self, service: str) -> Load:
        if service not in self.loads:
            rng = random.Random(f"{self.seed}/{service}")
            self.loads[service] = Load(
                base=rng.uniform(0.5, 6.0), period_s=rng.uniform(300, 1800), phase=rng.uniform(0, 6)
            )
        return self.loads[service]

    async def sync(self) -> None:
        """Listen on every Running pod's IP; stop listening on the IPs of pods that are gone."""
        listed = await asyncio.to_thread(
            self.api.get,
            f"/api/v1/namespaces/{self.namespace}/pods",
            labelSelector=f"app.kubernetes.io/managed-by={MANAGED_BY}",
        )
        live: dict[str, tuple[str, str]] = {}
        for item in listed["items"]:
            ip = item.get("status", {}).get("podIP")
            if ip and item["status"].get("phase") == "Running":
                service = item["metadata"]["labels"].get(SERVICE_LABEL, "")
                live[ip] = (item["metadata"]["name"], service)
        for ip in [ip for ip, pod in self.pods.items() if live.get(ip, ("",))[0] != pod.name]:
            pod = self.pods.pop(ip)
            if pod.server is not None:
                pod.server.close()
        for ip, (name, service) in live.items():
            if ip not in self.pods:
                pod = Pod(name, ip, self.load_of(service))
                pod.server = await asyncio.start_server(
                    lambda r, w, p=pod: self.serve(r, w, p), host=ip, port=RUNTIME_PORT
                )
                self.pods[ip] = pod

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pod: Pod):
        """HTTP/1.1 with keep-alive, as far as Prometheus' scrapes and the batch PUT need."""
        try:
            while line := await reader.readline():
                method, path = line.decode().split(" ", 2)[:2]
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    key, _, value = header.decode().partition(":")
                    if key.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                status, payload, kind = self.answer(pod, method, path.split("?")[0], body)
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    def answer(self, pod: Pod, method: str, path: str, body: bytes) -> tuple[str, bytes, str]:
        if method == "GET" and path == "/metrics":
            self.scrapes += 1
            return "200 OK", metrics_page(pod, time.monotonic() - self.started), "text/plain"
        if method == "PUT" and path == ADMIN_PATH:
            pod.batch = int(json.loads(body)["max_batch_size"])
            return "200 OK", json.dumps({"max_batch_size": pod.batch}).encode(), "application/json"
        if method == "GET" and path in ("/health", "/ready"):
            return "200 OK", b"{}", "application/json"
        return "404 Not Found", b"{}", "application/json"


async def main_async(args: argparse.Namespace) -> None:
    source = Source(KubeApi.from_kubeconfig(args.kubeconfig), args.namespace, args.seed)
    last_report = time.monotonic()
    while True:
        try:
            await source.sync()
        except Exception as error:  # the apiserver is busy: the next sync catches up
            print(f"sync failed: {error!r}", file=sys.stderr, flush=True)
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            print(f"{len(source.pods)} pods served, {source.scrapes} scrapes", flush=True)
        await asyncio.sleep(args.sync_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sync-s", type=float, default=2.0, help="how often to list the pods")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
