"""Operator scale on active services: N InferenceServices × 2 sim pods that answer and report.

Why: `bench/operator/results/operator_scale.json` (e2e/test_operator_scale.py) was measured on 200
paused services (maxReplicas 0), which take the cheap "no ready replicas" path every tick. Here
every service has its pods on the simulated accelerator (`sim:llama-3-8b-80g`, the real runtime but
for the forward pass), every pod answers a light, bounded trickle of real streamed completions on
its pod IP and is scraped by the harness's real Prometheus, so each tick reads real queue, running,
KV and latency series, runs the law, writes status and pushes the batch to the pods.

One operator process (`wok operator run --standalone`, as `operator_harness.OperatorProcess` starts
it for the e2e tests: the same flags as bench/autoscaling/autoscale_cluster.py's `Operator`, plus
the metrics port it exposes), one Prometheus (scraping every 5 s), on the emulated cluster. After
every pod is Ready, answers, and every service's status shows signals from both its pods, a measure
window of `--measure-s` reads, from its two ends:

- the operator's CPU (user + system from /proc/PID/stat, its threads included) and RSS;
- tick latency P50/P99 from the operator's own `wok_operator_control_loop_seconds` histogram
  (its /metrics, the window's bucket deltas; quantiles interpolated linearly within a bucket as
  PromQL's histogram_quantile does);
- the PromQL requests Prometheus itself counted (`prometheus_http_requests_total{handler=
  "/api/v1/query"}` and `prometheus_engine_query_duration_seconds_count{slice="inner_eval"}` on
  its own /metrics; nothing else queries it during the window), per service tick, per interval,
  and per round (the operator's rounds, from its `wok_operator_promql_requests_total`, against
  `signals.round_queries`);
- the machine's load average and busy cores, the pods' and every other component's CPU.

Bounded: every wait has a timeout, the trickle stops with the window, and `--deadline-s` stops
the whole run (processes and cluster are torn down in `finally`).

    .venv/bin/python bench/operator/operator_scale.py --services 50 --measure-s 240
    .venv/bin/python bench/operator/operator_scale.py --services 3 --measure-s 30 \
        --out out/opscale_smoke
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "autoscaling"), str(BENCH.parents[1] / "e2e")]

from autoscale_manifests import service_spec  # noqa: E402
from autoscale_settings import MODEL, PROFILE, SCRAPE_INTERVAL, Settings  # noqa: E402
from operator_harness import OperatorProcess, install_crds, kubectl  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from wok_cluster.apiserver import ControlPlane  # noqa: E402
from wok_cluster.binaries import BUILT, Binaries, bin_dir, missing  # noqa: E402
from wok_cluster.cluster import Cluster  # noqa: E402
from wok_cluster.kubeapi import KubeApi  # noqa: E402
from wok_cluster.process import RUN_MARKER, processes_marked  # noqa: E402
from wok_cluster.prometheus import Prometheus  # noqa: E402
from wok_cluster.waiting import GiveUp, wait_until  # noqa: E402
from wok_contracts.traces import TraceRequest  # noqa: E402
from wok_operator.resources import RUNTIME_PORT, SERVICE_LABEL  # noqa: E402
from wok_operator.signals import round_queries  # noqa: E402
from wok_runtime.tools.bench_http import send_completion  # noqa: E402
from wok_sim.prometheus import histogram_quantile  # noqa: E402

ROOT = BENCH.parents[1]
RESULTS = ROOT / "bench" / "operator" / "results"
RECORDING_RULES = ROOT / "charts" / "wok" / "files" / "recording_rules.yaml"
NAMESPACE = "opscale"
TICK_HISTOGRAM = "wok_operator_control_loop_seconds"
KUBE_CALLS = "wok_operator_kube_call_seconds"
WRITE_LAG = "wok_operator_write_lag_seconds"
QUERY_HANDLER = "/api/v1/query"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# which component a process of the run is, by its command line (first match)
COMPONENTS = (
    ("pods", "runtime serve"),
    ("pod-metrics-source", "emulated_pod_metrics"),
    ("operator", "operator run"),
    ("pod-backer", "dev backer"),
    ("kube-apiserver", "kube-apiserver"),
    ("kube-controller-manager", "kube-controller-manager"),
    ("kube-scheduler", "kube-scheduler"),
    ("kwok", "kwok"),
    ("etcd", "etcd"),
    ("prometheus", "prometheus"),
)


class Deadline(Exception):
    """`--deadline-s` ran out."""


# --- reading /proc and /metrics ----------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU-seconds the whole machine spent outside idle and iowait since boot."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLK_TCK


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def component(cmdline: str) -> str:
    return next((name for name, needle in COMPONENTS if needle in cmdline), "other")


def cpu_by_pid(run_marker: str) -> dict[int, tuple[str, float]]:
    """Every live process of the run (the harness marks them), with its component and CPU-s."""
    out = {}
    for pid, cmdline in processes_marked(run_marker):
        cpu = cpu_seconds(pid)
        if cpu is not None:
            out[pid] = (component(cmdline), cpu)
    return out


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """A /metrics page as {(sample name, labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(page: dict[tuple[str, frozenset], float], name: str, **match: str) -> float:
    """The sum of the samples `name` whose labels include `match`."""
    want = set(match.items())
    return sum(v for (n, labels), v in page.items() if n == name and want <= labels)


def buckets(page: dict[tuple[str, frozenset], float], histogram: str) -> dict[float, float]:
    return {
        float(dict(labels)["le"]): v
        for (n, labels), v in page.items()
        if n == f"{histogram}_bucket"
    }


def tick_quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """PromQL's histogram_quantile (`wok_sim.prometheus.histogram_quantile`) on cumulative
    bucket counts {upper bound: count, +Inf included}; None without observations."""
    bounds = sorted(b for b in cumulative if not math.isinf(b))
    counts = [cumulative[b] for b in bounds] + [cumulative.get(math.inf, 0.0)]
    value = histogram_quantile(q, bounds, counts) if bounds else math.nan
    return None if math.isnan(value) else value


# --- the services and their trickle ------------------------------------------------------------


def inference_service(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """autoscale_cluster's InferenceService on sim pods, small and fast to start, its replicas
    held at `--pods` (the law still runs; it can only hold them)."""
    settings = Settings(
        minutes=0,
        rate_scale=1,
        max_replicas=args.pods,
        slo_ttft_s=2.0,
        slo_tpot_s=0.1,
        slo_e2e_s=5.0,
        load_seconds=args.load_seconds,
        seed=0,
    )
    spec = service_spec("wok", settings, args.pods, None)
    spec["runtime"] |= {"cpu": "100m", "memory": "256Mi"}
    spec["memory"] = {"maxModelLen": args.max_model_len}
    spec["scaling"] |= {"intervalSeconds": args.interval}
    return {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def ready_pods(api: KubeApi) -> dict[str, list[str]]:
    """Pod IPs of the Ready, non-terminating runtime pods, by service."""
    pods = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=SERVICE_LABEL)["items"]
    out: dict[str, list[str]] = defaultdict(list)
    for p in pods:
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
        if ready and p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp"):
            out[p["metadata"]["labels"][SERVICE_LABEL]].append(p["status"]["podIP"])
    return dict(out)


def active_services(api: KubeApi, pods: int) -> dict[str, dict[str, Any]]:
    """Each service's last recorded inputs: active = both pods ready and reporting to Prometheus,
    metrics flowing (the path the paused services never took)."""
    items = api.get(f"/apis/wok.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices")["items"]
    out = {}
    for w in items:
        status = w.get("status") or {}
        inputs = (status.get("lastDecision") or {}).get("inputs") or {}
        flowing = any(
            c["type"] == "MetricsUnavailable" and c["status"] == "False"
            for c in status.get("conditions", [])
        )
        out[w["metadata"]["name"]] = {
            "active": flowing
            and inputs.get("readyReplicas") == pods
            and inputs.get("reportingReplicas") == pods,
            "p99_known": inputs.get("p99Seconds") is not None,
            "batch": status.get("batchSize"),
        }
    return out


@dataclass
class Trickle:
    """Poisson arrivals per service, round-robin over its pods, at most `limit` in flight."""

    pods: dict[str, list[str]]
    rate: float
    prompt_len: int
    output_len: int
    limit: int = 64
    seed: int = 0
    answered: Counter = field(default_factory=Counter)  # pod IP → 200s
    failed: Counter = field(default_factory=Counter)  # "status error" → count
    latencies: list[float] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        limits = httpx.Limits(max_connections=self.limit, max_keepalive_connections=self.limit)
        gate = asyncio.Semaphore(self.limit)
        rng = random.Random(self.seed)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0)) as client:

            async def one(ip: str) -> None:
                async with gate:
                    spec = TraceRequest(0.0, self.prompt_len, self.output_len)
                    url = f"http://{ip}:{RUNTIME_PORT}"
                    result = await send_completion(client, url, MODEL, spec, rng)
                if result.ok:
                    self.answered[ip] += 1
                    if result.e2e_s is not None:
                        self.latencies.append(result.e2e_s)
                else:
                    self.failed[f"{result.status} {result.error or result.body or ''}"[:100]] += 1

            async def service(ips: list[str]) -> None:
                sent: set[asyncio.Task] = set()
                for i in itertools.count():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), rng.expovariate(self.rate))
                    if stop.is_set():
                        break
                    task = asyncio.create_task(one(ips[i % len(ips)]))
                    sent.add(task)
                    task.add_done_callback(sent.discard)
                if sent:  # in flight: bounded by the client's timeout
                    await asyncio.wait(sent, timeout=35)

            await asyncio.gather(*(service(ips) for ips in self.pods.values()))


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    at: float
    operator: dict[tuple[str, frozenset], float]
    prometheus: dict[tuple[str, frozenset], float]
    apiserver: dict[tuple[str, frozenset], float]
    cpu: dict[int, tuple[str, float]]
    busy_s: float
    self_cpu_s: float


def snapshot(
    operator: OperatorProcess, prometheus: Prometheus, run_marker: str, plane: ControlPlane
) -> Snapshot:
    prom = httpx.get(f"{prometheus.url}/metrics", timeout=10).text
    apiserver = httpx.get(
        f"{plane.server}/metrics",
        headers={"Authorization": f"Bearer {plane.tokens['admin']}"},
        verify=str(plane.pki.ca_cert),
        timeout=30,
    ).text
    return Snapshot(
        at=time.monotonic(),
        operator=samples(operator.metrics()),
        prometheus=samples(prom),
        apiserver=samples(apiserver),
        cpu=cpu_by_pid(run_marker),
        busy_s=machine_busy_seconds(),
        self_cpu_s=cpu_seconds(os.getpid()) or 0.0,
    )


def cpu_cores(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Cores per component over the window (a process started inside it counts from 0)."""
    return component_cores(before.cpu, after.cpu, after.at - before.at)


def component_cores(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall: float
) -> dict[str, float]:
    used: dict[str, float] = defaultdict(float)
    for pid, (name, cpu) in after.items():
        used[name] += cpu - before.get(pid, (name, 0.0))[1]
    return {name: round(cpu / wall, 4) for name, cpu in sorted(used.items())}


async def quiet_window(operator: OperatorProcess, run_marker: str, seconds: float) -> dict:
    """Every component's cores while the operator is stopped (SIGSTOP): Prometheus' CPU without
    the operator's queries, its scrapes and rules alone; the difference to the measure window is
    what the queries cost it in CPU, not in wall time as its own timings count."""
    os.kill(operator.popen.pid, signal.SIGSTOP)
    try:
        started, before = time.monotonic(), cpu_by_pid(run_marker)
        await asyncio.sleep(seconds)
        return component_cores(before, cpu_by_pid(run_marker), time.monotonic() - started)
    finally:
        os.kill(operator.popen.pid, signal.SIGCONT)


async def drive_and_measure(
    args: argparse.Namespace,
    api: KubeApi,
    operator: OperatorProcess,
    prometheus: Prometheus,
    pods: dict[str, list[str]],
    run_marker: str,
    plane: ControlPlane,
) -> dict[str, Any]:
    # Emulated pods answer no completions: their series come from the metrics source.
    rate = 0.0 if args.emulated else args.rate
    trickle = Trickle(pods if rate else {}, rate, args.prompt_len, args.output_len, seed=args.seed)
    stop = asyncio.Event()
    driver = asyncio.create_task(trickle.run(stop))
    every_pod = [ip for ips in pods.values() for ip in ips] if rate else []
    warm_started = time.monotonic()
    state: dict[str, dict[str, Any]] = {}
    try:
        # Warm-up: the rate() windows fill, every pod has answered, every service is active.
        while True:
            if driver.done():
                driver.result()  # raises what stopped it
            if not operator.alive():
                raise RuntimeError(f"the operator exited:\n{operator.log_tail()}")
            waited = time.monotonic() - warm_started
            state = await asyncio.to_thread(active_services, api, args.pods)
            n_active = sum(s["active"] for s in state.values())
            n_answered = sum(1 for ip in every_pod if trickle.answered[ip])
            print(
                f"warm-up {waited:4.0f} s: {n_active}/{args.services} services active, "
                f"{n_answered}/{len(every_pod)} pods answered, load {os.getloadavg()[0]:.2f}",
                file=sys.stderr,
                flush=True,
            )
            complete = n_active == args.services and n_answered == len(every_pod)
            if waited >= args.warmup_s and (complete or waited >= args.warmup_max_s):
                break
            await asyncio.sleep(5)
        warmup_s = time.monotonic() - warm_started
        answered_before = Counter(trickle.answered)
        failed_before = sum(trickle.failed.values())
        before = await asyncio.to_thread(snapshot, operator, prometheus, run_marker, plane)
        load: list[tuple[float, float, float]] = []
        end = before.at + args.measure_s
        while (left := end - time.monotonic()) > 0:
            load.append(os.getloadavg())
            await asyncio.sleep(min(5.0, left))
        after = await asyncio.to_thread(snapshot, operator, prometheus, run_marker, plane)
        load.append(os.getloadavg())
        quiet = await quiet_window(operator, run_marker, args.quiet_s) if args.quiet_s else {}
        state_after = await asyncio.to_thread(active_services, api, args.pods)
        memory = memory_kib(operator.popen.pid)
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(driver, 40)
    window_answers = {ip: trickle.answered[ip] - answered_before[ip] for ip in every_pod}
    return {
        "warmup_s": round(warmup_s, 1),
        "before": before,
        "after": after,
        "load": load,
        "memory": memory,
        "quiet_cores": quiet,
        "active_at_start": sum(s["active"] for s in state.values()),
        "active_at_end": sum(s["active"] for s in state_after.values()),
        "p99_known_at_end": sum(s["p99_known"] for s in state_after.values()),
        "batches_at_end": dict(Counter(str(s["batch"]) for s in state_after.values())),
        "window_answers": window_answers,
        "window_failed": sum(trickle.failed.values()) - failed_before,
        "failed_reasons": trickle.failed.most_common(5),
        "client_e2e_median_s": statistics.median(trickle.latencies) if trickle.latencies else None,
        "requests_answered": sum(trickle.answered.values()),
    }


def series_over_window(prometheus: Prometheus, seconds: float) -> dict[str, Any]:
    """After the window (so as not to count in it): how busy the signals the operator read were."""
    w = f"{max(10, round(seconds))}s"
    by = "by (service)"

    def per_service(promql: str) -> list[float]:
        return [float(s["value"][1]) for s in prometheus.query(promql)]

    running = per_service(f"max_over_time((sum {by} (vllm:num_requests_running))[{w}:5s])")
    waiting = per_service(f"max_over_time((sum {by} (vllm:num_requests_waiting))[{w}:5s])")
    finished = per_service(f"sum {by} (increase(vllm:e2e_request_latency_seconds_count[{w}]))")
    return {
        "services_with_running_gt0": sum(1 for v in running if v > 0),
        "services_with_waiting_gt0": sum(1 for v in waiting if v > 0),
        "max_running": max(running, default=None),
        "max_waiting": max(waiting, default=None),
        "services_with_finished_gt0": sum(1 for v in finished if v > 0),
        "finished_total": round(sum(finished)),
    }


def query_log_summary(path: Path, since: float, until: float, top: int = 8) -> dict[str, Any]:
    """Where Prometheus' query time went in the window, from its query log (one JSON line per
    query, the rule groups' included): per query text, how many, their evaluation seconds (wall)
    and the samples they read (the work, whatever the machine's load)."""
    by_query: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for line in path.read_text().splitlines() if path.exists() else ():
        entry = None
        with contextlib.suppress(ValueError):  # a line Prometheus is still writing
            entry = json.loads(line)
        # Prometheus 2 names the time `ts`, Prometheus 3 (slog) `time`.
        stamp = entry.get("ts") or entry.get("time") if isinstance(entry, dict) else None
        if not stamp or "params" not in entry:
            continue
        at = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        if since <= at <= until:
            source = "rule" if "ruleGroup" in entry else "api"
            text = f"{source}: {entry['params'].get('query')}"
            stats = entry.get("stats", {})
            by_query[text][0] += 1
            by_query[text][1] += stats.get("timings", {}).get("evalTotalTime", 0.0)
            by_query[text][2] += stats.get("samples", {}).get("totalQueryableSamples", 0)

    def summed(source: str, i: int) -> float:
        return sum(v[i] for k, v in by_query.items() if k.startswith(source))

    ranked = sorted(by_query.items(), key=lambda kv: -kv[1][2])
    return {
        "queries_api": int(summed("api", 0)),
        "queries_rules": int(summed("rule", 0)),
        "eval_s_api": round(summed("api", 1), 2),
        "eval_s_rules": round(summed("rule", 1), 2),
        "samples_api": int(summed("api", 2)),
        "samples_rules": int(summed("rule", 2)),
        "top_by_samples": [
            {"query": k[:300], "count": v[0], "eval_s": round(v[1], 3), "samples": int(v[2])}
            for k, v in ranked[:top]
        ],
    }


def quantiles_by_label(
    before: dict[tuple[str, frozenset], float],
    after: dict[tuple[str, frozenset], float],
    histogram: str,
    label: str,
    wall: float,
) -> dict[str, dict[str, float | None]]:
    """Per value of `label`, the histogram's rate and bucket-interpolated P50 and P99 over the
    window."""
    out = {}
    values = {dict(labels)[label] for (n, labels) in after if n == f"{histogram}_count"}
    for value in sorted(values):
        now = {
            float(dict(labels)["le"]): v - before.get((n, labels), 0.0)
            for (n, labels), v in after.items()
            if n == f"{histogram}_bucket" and dict(labels)[label] == value
        }
        out[value] = {
            "per_s": round(now.get(math.inf, 0.0) / wall, 3),
            "p50_s": tick_quantile(0.5, now),
            "p99_s": tick_quantile(0.99, now),
        }
    return out


def writes_by_resource(
    before: dict[tuple[str, frozenset], float], after: dict[tuple[str, frozenset], float]
) -> Counter:
    """The apiserver's writes between two of its /metrics pages, by verb and resource."""
    by_resource: Counter = Counter()
    for (name, labels), value in after.items():
        fields = dict(labels)
        if name == "apiserver_request_total" and fields.get("verb") not in ("GET", "LIST", "WATCH"):
            key = f"{fields.get('verb')} {fields.get('resource')}/{fields.get('subresource', '')}"
            by_resource[key] += value - before.get((name, labels), 0.0)
    return by_resource


def status_writes_by_cause(
    before: dict[tuple[str, frozenset], float],
    after: dict[tuple[str, frozenset], float],
    per: float,
) -> dict[str, float]:
    """The operator's status writes between two of its /metrics pages by cause
    (`loop.status_write_cause`), divided by `per` (services × minutes), largest first."""
    name = "wok_operator_status_writes_total"
    causes: Counter = Counter()
    for (n, labels), value in after.items():
        if n == name:
            causes[dict(labels).get("cause", "")] += value - before.get((n, labels), 0.0)
    return {cause: round(v / per, 3) for cause, v in causes.most_common() if v > 0}


def ramp_figures(
    args: argparse.Namespace, start: Snapshot, end: Snapshot, ready: list[tuple[float, int]]
) -> dict[str, Any]:
    """From the operator's start to every pod ready (or to giving up): what each component
    spent, what the apiserver wrote, and why the operator wrote status."""
    wall = end.at - start.at
    hist = buckets(end.operator, TICK_HISTOGRAM)
    old = buckets(start.operator, TICK_HISTOGRAM)
    delta = {le: hist[le] - old.get(le, 0.0) for le in hist}
    writes = writes_by_resource(start.apiserver, end.apiserver)
    return {
        "seconds": round(wall, 1),
        "pods_ready_over_time": [(round(t, 1), n) for t, n in ready],
        "cpu_cores_by_component": cpu_cores(start, end),
        "machine_busy_cores": round((end.busy_s - start.busy_s) / wall, 3),
        "apiserver_writes_per_s": round(sum(writes.values()) / wall, 2),
        "apiserver_writes_by_resource": {k: round(v) for k, v in writes.most_common(16)},
        "tick_p50_s": tick_quantile(0.5, delta),
        "tick_p99_s": tick_quantile(0.99, delta),
        "ticks_without_signals": int(
            total(end.operator, "wok_operator_ticks_without_signals_total")
            - total(start.operator, "wok_operator_ticks_without_signals_total")
        ),
        "status_writes_per_service_per_min_by_cause": status_writes_by_cause(
            start.operator, end.operator, args.services * wall / 60
        ),
    }


Page = dict[tuple[str, frozenset], float]


def growth(before: Page, after: Page, name: str, **match: str) -> float:
    """How much the samples `name` whose labels include `match` grew between two scrapes."""
    return total(after, name, **match) - total(before, name, **match)


def figures(args: argparse.Namespace, m: dict[str, Any], pods_total: int) -> dict[str, Any]:
    """A run's figures over its measure window, from the scrapes at its two ends."""
    before, after = m["before"], m["after"]
    cores = cpu_cores(before, after)
    ticks = growth(before.operator, after.operator, f"{TICK_HISTOGRAM}_count")
    http = growth(
        before.prometheus, after.prometheus, "prometheus_http_requests_total", handler=QUERY_HANDLER
    )
    return {
        **tick_figures(args, m, pods_total, cores, ticks),
        **promql_figures(args, before, after, ticks, http),
        "cpu_cores_by_component": cores,
        **write_figures(args, before, after),
        **prometheus_cost_figures(m, before, after, cores, http),
        **machine_figures(m, before, after, cores),
    }


def tick_figures(
    args: argparse.Namespace, m: dict[str, Any], pods_total: int, cores: dict, ticks: float
) -> dict[str, Any]:
    """The run's shape, and the operator's ticks: how many, how long, its API calls and writes."""
    before, after = m["before"], m["after"]
    wall = after.at - before.at
    op_b, op_a = before.operator, after.operator
    hist = buckets(op_a, TICK_HISTOGRAM)
    old = buckets(op_b, TICK_HISTOGRAM)
    delta = {le: hist[le] - old.get(le, 0.0) for le in hist}
    tick_sum = growth(op_b, op_a, f"{TICK_HISTOGRAM}_sum")
    intervals = wall / args.interval
    return {
        "services": args.services,
        "pods_per_service": args.pods,
        "pods": pods_total,
        "interval_s": args.interval,
        "measured_s": round(wall, 1),
        "warmup_s": m["warmup_s"],
        "operator_cpu_cores": cores.get("operator"),
        "operator_cpu_s_per_service_tick": round(cores.get("operator", 0) * wall / ticks, 5)
        if ticks
        else None,
        "operator_rss_mib": round(m["memory"].get("VmRSS", 0) / 1024, 1),
        "operator_rss_peak_mib": round(m["memory"].get("VmHWM", 0) / 1024, 1),
        "service_ticks": int(ticks),
        "ticks_per_service_per_interval": round(ticks / args.services / intervals, 3),
        "tick_p50_s": tick_quantile(0.5, delta),
        "tick_p99_s": tick_quantile(0.99, delta),
        "tick_mean_s": round(tick_sum / ticks, 4) if ticks else None,
        "ticks_without_signals": int(
            growth(op_b, op_a, "wok_operator_ticks_without_signals_total")
        ),
        "kube_calls": quantiles_by_label(op_b, op_a, KUBE_CALLS, "call", wall),
        "write_lag": quantiles_by_label(op_b, op_a, WRITE_LAG, "kind", wall),
        "tick_buckets_window": {
            ("+Inf" if math.isinf(k) else f"{k:g}"): v for k, v in sorted(delta.items())
        },
    }


def promql_figures(
    args: argparse.Namespace, before: Snapshot, after: Snapshot, ticks: float, http: float
) -> dict[str, Any]:
    """The operator's Prometheus rounds and the queries they sent, as both ends counted them."""
    wall = after.at - before.at
    intervals = wall / args.interval
    pr_b, pr_a = before.prometheus, after.prometheus
    per_round = len(round_queries({60}, {3600}))  # the SLO and budget windows
    sent = growth(before.operator, after.operator, "wok_operator_promql_requests_total")
    rounds = sent / per_round
    http_200 = growth(
        pr_b, pr_a, "prometheus_http_requests_total", handler=QUERY_HANDLER, code="200"
    )
    engine = growth(
        pr_b, pr_a, "prometheus_engine_query_duration_seconds_count", slice="inner_eval"
    )
    return {
        "rounds_operator": round(rounds, 2),
        "rounds_per_interval": round(rounds / intervals, 3),
        "queries_per_round_expected": per_round,
        "promql_sent_by_operator": int(sent),
        "promql_http_requests_prometheus": int(http),
        "promql_http_requests_prometheus_200": int(http_200),
        "promql_engine_queries_prometheus": int(engine),
        "promql_requests_per_service_tick": round(http / ticks, 3) if ticks else None,
        "promql_requests_per_interval": round(http / intervals, 2),
        "promql_requests_per_round": round(http / rounds, 2) if rounds else None,
    }


def write_figures(args: argparse.Namespace, before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """The apiserver's writes (the operator's status writes among them) and watch events."""
    wall = after.at - before.at
    ap_b, ap_a = before.apiserver, after.apiserver
    writes = sum(
        growth(ap_b, ap_a, "apiserver_request_total", verb=verb)
        for verb in ("POST", "PUT", "PATCH", "DELETE", "APPLY")
    )
    status_patches = growth(
        ap_b,
        ap_a,
        "apiserver_request_total",
        verb="PATCH",
        resource="inferenceservices",
        subresource="status",
    )
    by_resource = writes_by_resource(ap_b, ap_a)
    status_writes = growth(before.operator, after.operator, "wok_operator_status_writes_total")
    watch_events = growth(ap_b, ap_a, "apiserver_watch_events_total")
    service_events = growth(
        ap_b, ap_a, "apiserver_watch_events_total", resource="inferenceservices"
    )
    return {
        "apiserver_writes_per_s": round(writes / wall, 2),
        "apiserver_writes_by_resource": {k: round(v) for k, v in by_resource.most_common(12)},
        "apiserver_status_patches_per_s": round(status_patches / wall, 3),
        "status_writes_per_service_per_min": round(status_writes / args.services / wall * 60, 3),
        "status_writes_per_service_per_min_by_cause": status_writes_by_cause(
            before.operator, after.operator, args.services * wall / 60
        ),
        "watch_events_per_s": round(watch_events / wall, 2),
        "watch_events_inferenceservices_per_s": round(service_events / wall, 3),
    }


def prometheus_cost_figures(
    m: dict[str, Any], before: Snapshot, after: Snapshot, cores: dict, http: float
) -> dict[str, Any]:
    """What the operator's queries cost Prometheus: its engine's time and its CPU."""
    wall = after.at - before.at
    pr_b, pr_a = before.prometheus, after.prometheus
    engine_s = growth(
        pr_b, pr_a, "prometheus_engine_query_duration_seconds_sum", slice="inner_eval"
    )
    api_s = growth(
        pr_b, pr_a, "prometheus_http_request_duration_seconds_sum", handler=QUERY_HANDLER
    )
    rules_s = growth(pr_b, pr_a, "prometheus_rule_group_duration_seconds_sum")
    return {
        "promql_requests_per_s": round(http / wall, 2),
        "prometheus_query_engine_cores": round(engine_s / wall, 4),
        "cpu_cores_operator_stopped": m["quiet_cores"],
        "prometheus_query_cpu_cores": round(
            cores.get("prometheus", 0.0) - m["quiet_cores"]["prometheus"], 4
        )
        if m["quiet_cores"]
        else None,
        # Wall time, not CPU: the operator's queries as Prometheus' HTTP handler timed them, and
        # the recording rules' evaluations (both inside the engine's figure above).
        "prometheus_query_api_cores": round(api_s / wall, 4),
        "prometheus_rule_evaluation_cores": round(rules_s / wall, 4),
    }


def machine_figures(
    m: dict[str, Any], before: Snapshot, after: Snapshot, cores: dict
) -> dict[str, Any]:
    """The machine's load, the services' state at the window's ends, and the pods' answers."""
    wall = after.at - before.at
    load1 = [x[0] for x in m["load"]]
    answers = m["window_answers"]
    return {
        "pods_cpu_cores": cores.get("pods"),
        "bench_client_cpu_cores": round((after.self_cpu_s - before.self_cpu_s) / wall, 4),
        "machine_busy_cores": round((after.busy_s - before.busy_s) / wall, 3),
        "load1_median": round(statistics.median(load1), 2),
        "load1_max": round(max(load1), 2),
        "load5_end": round(m["load"][-1][1], 2),
        "services_active_at_start": m["active_at_start"],
        "services_active_at_end": m["active_at_end"],
        "services_p99_known_at_end": m["p99_known_at_end"],
        "batch_sizes_at_end": m["batches_at_end"],
        "pods_answering_in_window": sum(1 for v in answers.values() if v > 0),
        "completions_in_window": sum(answers.values()),
        "completions_failed_in_window": m["window_failed"],
        "failed_reasons": m["failed_reasons"],
        "client_e2e_median_s": m["client_e2e_median_s"],
    }


def create_all(kubeconfig: Path, docs: list[dict[str, Any]], streams: int = 4) -> float:
    """Create the InferenceServices in `streams` kubectl processes at once (one POST each, no
    client-side apply's read first); returns the seconds it took."""

    def create(chunk: list[dict[str, Any]]) -> str:
        text = yaml.safe_dump_all(chunk)
        return kubectl(kubeconfig, "create", "-n", NAMESPACE, "-f", "-", stdin=text)

    started = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(create, [docs[i::streams] for i in range(streams) if docs[i::streams]]))
    return time.monotonic() - started


def start_metrics_source(kubeconfig: Path, run_dir: Path, run_marker: str) -> subprocess.Popen:
    """bench/operator/emulated_pod_metrics.py for the namespace: every emulated pod's series and
    admin API, on the pod's own IP (it is stopped with the run's other processes, by its marker)."""
    with (run_dir / "pod-metrics.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                str(BENCH / "emulated_pod_metrics.py"),
                f"--kubeconfig={kubeconfig}",
                f"--namespace={NAMESPACE}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, RUN_MARKER: run_marker},
            start_new_session=True,
        )


def run(args: argparse.Namespace, command: str) -> dict[str, Any]:
    if missing(BUILT):
        raise SystemExit(f"{missing(BUILT)} not built in {bin_dir()}: run cluster/build.sh")
    started = time.monotonic()
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    run_dir = Path(tempfile.mkdtemp(prefix="wok-opscale-"))
    run_marker = str(run_dir)
    pods_total = args.services * args.pods
    plane = ControlPlane(run_dir, Binaries(bin_dir()))
    cluster = Cluster(plane, nodes=max(2, math.ceil(pods_total / 32)), gpus_per_node=32)
    prometheus = logging_prometheus(args, plane, run_dir)
    query_log = run_dir / "prometheus" / "query.log"
    operator: OperatorProcess | None = None
    out: dict[str, Any] = {}
    print(f"run files in {run_dir}", file=sys.stderr, flush=True)
    try:
        plane.start()
        cluster.start(timeout=180)
        prometheus.start()
        kc = plane.kubeconfig
        install_crds(kc)
        kubectl(kc, "create", "namespace", NAMESPACE)
        docs = [inference_service(f"s{i:03d}", args) for i in range(args.services)]
        create_s = create_all(kc, docs)
        print(f"{len(docs)} InferenceServices created in {create_s:.1f} s", file=sys.stderr)
        if args.emulated:
            start_metrics_source(kc, run_dir, run_marker)
        operator = start_operator(args, kc, prometheus, run_dir)
        applied = time.monotonic()
        ramp_start = snapshot(operator, prometheus, run_marker, plane)
        ready_over_time: list[tuple[float, int]] = []
        with plane.api() as api:

            def all_ready() -> dict[str, list[str]] | None:
                if not operator.alive():
                    raise GiveUp(f"the operator exited:\n{operator.log_tail()}")
                pods = ready_pods(api)
                n = sum(len(v) for v in pods.values())
                ready_over_time.append((time.monotonic() - applied, n))
                print(f"{n}/{pods_total} pods ready", file=sys.stderr, flush=True)
                return pods if n == pods_total else None

            out["services_created_s"] = round(create_s, 1)
            try:
                pods = wait_until(all_ready, timeout=args.ready_timeout_s, what="pods", interval=5)
            except TimeoutError as error:
                pods = None
                out["outcome"] = f"gave up at --ready-timeout-s: {error}"
            # The ramp's figures, also when it never ends: they say why.
            ramp_end = snapshot(operator, prometheus, run_marker, plane)
            out["ramp"] = ramp_figures(args, ramp_start, ramp_end, ready_over_time)
            if pods is None:
                return finished(args, command, date, started, out)
            pods_ready_s = time.monotonic() - applied
            measured = asyncio.run(
                drive_and_measure(args, api, operator, prometheus, pods, run_marker, plane)
            )
            window = measured["after"].at - measured["before"].at
        out |= figures(args, measured, pods_total)
        window_end = time.time() - (time.monotonic() - measured["after"].at)
        out["query_log"] = query_log_summary(query_log, window_end - window, window_end)
        out["series_in_window"] = series_over_window(prometheus, window)
        out["pods_ready_s"] = round(pods_ready_s, 1)
        out["operator_restarts"] = 0 if operator.alive() else 1
    finally:
        stop_run(operator, (prometheus.stop, cluster.stop, plane.stop), run_dir, keep=args.keep)
    return finished(args, command, date, started, out)


def logging_prometheus(args: argparse.Namespace, plane: ControlPlane, run_dir: Path) -> Prometheus:
    """The run's Prometheus (not started), logging its queries to prometheus/query.log, with
    the chart's recording rules unless --no-recording-rules."""
    prometheus = Prometheus(plane, run_dir / "prometheus", interval=args.scrape_interval)
    prometheus.config["global"]["query_log_file"] = str(run_dir / "prometheus" / "query.log")
    if not args.no_recording_rules:  # as the chart installs them (recordingRules.enabled)
        rules = run_dir / "prometheus" / "recording_rules.yaml"
        shutil.copy(RECORDING_RULES, rules)
        prometheus.config["rule_files"] = [str(rules)]
    return prometheus


def start_operator(
    args: argparse.Namespace, kubeconfig: Path, prometheus: Prometheus, run_dir: Path
) -> OperatorProcess:
    """The operator on the namespace, live."""
    operator = OperatorProcess(
        kubeconfig,
        NAMESPACE,
        prometheus.url,
        run_dir / "operator.log",
        run_marker=str(run_dir),
        # Emulated pods: KWOK plays their kubelet, the metrics source their runtime.
        extra_args=["--pod-label=wok.dev/backed=false"] if args.emulated else (),
    )
    operator.wait_live()
    return operator


def stop_run(
    operator: OperatorProcess | None,
    stops: tuple[Callable[[], Any], ...],
    run_dir: Path,
    *,
    keep: bool,
) -> None:
    """Stops the operator, then each part in turn, then anything of the run still alive; the
    run's files go unless `keep`."""
    if operator is not None:
        with contextlib.suppress(AssertionError):
            operator.stop()
    for stop in stops:
        with contextlib.suppress(Exception):
            stop()
    for pid, _ in processes_marked(str(run_dir)):  # anything of this run still alive
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)


def finished(
    args: argparse.Namespace, command: str, date: str, started: float, out: dict[str, Any]
) -> dict[str, Any]:
    return {
        "command": command,
        "date": date,
        "wall_s": round(time.monotonic() - started, 1),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "keep", "note")},
        "profile": PROFILE,
        "prometheus_scrape_interval": args.scrape_interval,
        "recording_rules": not args.no_recording_rules,
        "notes": args.note,
        **out,
    }


# --- the report --------------------------------------------------------------------------------


def ms(x: float | None) -> str:
    return "–" if x is None else f"{1000 * x:.1f} ms"


def write_markdown(r: dict[str, Any], paused: dict[str, Any] | None, raw: str) -> str:
    """operator_scale_active.md: how the run went, its figures, how they are read, its notes."""
    lines = [
        "# Operator scale on active services",
        "",
        f"Made by `bench/operator/operator_scale.py` (raw figures in `{raw}`):",
        "",
        f"```\n{r['command']}\n```",
        "",
        run_summary(r),
        "",
        *figure_table(r),
        "",
        *how_read(r),
    ]
    if paused:
        lines += ["", *paused_figures(paused)]
    if r.get("notes"):
        lines += ["", "## Notes", "", *(f"- {n}" for n in r["notes"])]
    return "\n".join(lines) + "\n"


def run_summary(r: dict[str, Any]) -> str:
    """The run's paragraph: when, how long each phase, and what ran against what load."""
    return (
        f"Run {r['date']}, {r['wall_s']:.0f} s wall in all ({r['pods_ready_s']:.0f} s until "
        f"every pod was Ready, {r['warmup_s']:.0f} s warm-up, {r['measured_s']:.0f} s measured). "
        f"{r['services']} InferenceServices × {r['pods_per_service']} pods on `{r['profile']}` "
        f"(the real runtime on the simulated accelerator, {r['settings']['load_seconds']:g} s "
        f"load, maxModelLen {r['settings']['max_model_len']}), replicas held at "
        f"{r['pods_per_service']} (min = max), interval {r['interval_s']} s, in one namespace; "
        "one `wok operator run --standalone`; one Prometheus scraping every "
        f"{r['prometheus_scrape_interval']}. Every pod got a Poisson trickle of streamed "
        f"completions on its pod IP ({r['settings']['rate']:g} req/s per service, round-robin "
        f"over its pods, {r['settings']['prompt_len']}-token prompts, "
        f"{r['settings']['output_len']} output tokens, `ignore_eos`) from warm-up to the "
        "window's end. The window opened once every pod had answered and every service's status "
        "showed both pods ready and reporting to Prometheus with metrics flowing (or the "
        "warm-up's bound ran out: see the active count)."
    )


def figure_table(r: dict[str, Any]) -> list[str]:
    """The run's figures as a two-column table."""
    cores = r["cpu_cores_by_component"]
    return [
        "| figure | value |",
        "|---|---|",
        f"| services / pods | {r['services']} / {r['pods']} |",
        f"| services active (both pods ready + reporting, metrics flowing) at the window's start"
        f" / end | {r['services_active_at_start']} / {r['services_active_at_end']} |",
        f"| services whose last decision read a P99 | {r['services_p99_known_at_end']} |",
        f"| pods that answered in the window | {r['pods_answering_in_window']} / {r['pods']} "
        f"({r['completions_in_window']} completions, {r['completions_failed_in_window']} "
        "failed) |",
        f"| operator CPU | **{r['operator_cpu_cores']:.3f} cores** "
        f"({1000 * r['operator_cpu_s_per_service_tick']:.2f} ms per service tick) |",
        f"| operator RSS (end / peak) | {r['operator_rss_mib']:.0f} / "
        f"{r['operator_rss_peak_mib']:.0f} MiB |",
        f"| service ticks in the window | {r['service_ticks']} "
        f"({r['ticks_per_service_per_interval']:.2f} per service per interval) |",
        f"| tick latency P50 / P99 (bucket-interpolated) | **{ms(r['tick_p50_s'])} / "
        f"{ms(r['tick_p99_s'])}** (mean {ms(r['tick_mean_s'])}) |",
        f"| PromQL requests counted by Prometheus (`{QUERY_HANDLER}`) | "
        f"{r['promql_http_requests_prometheus']} ({r['promql_http_requests_prometheus_200']} "
        f"200s; engine inner_eval count {r['promql_engine_queries_prometheus']}) |",
        f"| operator's own count of queries sent | {r['promql_sent_by_operator']} |",
        f"| rounds (operator's count ÷ {r['queries_per_round_expected']}) | "
        f"{r['rounds_operator']:g} ({r['rounds_per_interval']:.2f} per interval) |",
        f"| PromQL requests per round (Prometheus ÷ rounds) | "
        f"**{r['promql_requests_per_round']}** (code: `len(round_queries({{60}}, {{3600}}))` = "
        f"{r['queries_per_round_expected']}) |",
        f"| PromQL requests per service tick | **{r['promql_requests_per_service_tick']}** |",
        f"| PromQL requests per interval | {r['promql_requests_per_interval']} |",
        f"| pods' CPU, all {r['pods']} together | {r['pods_cpu_cores']:.3f} cores |",
        f"| Prometheus / kube-apiserver / etcd CPU | {cores.get('prometheus', 0):.3f} / "
        f"{cores.get('kube-apiserver', 0):.3f} / {cores.get('etcd', 0):.3f} cores |",
        f"| the load generator (this script) | {r['bench_client_cpu_cores']:.3f} cores |",
        f"| machine busy (all processes, 2 cores) | {r['machine_busy_cores']:.2f} cores |",
        f"| load average 1 min, median / max; 5 min at the end | {r['load1_median']} / "
        f"{r['load1_max']}; {r['load5_end']} |",
    ]


def how_read(r: dict[str, Any]) -> list[str]:
    """Every component's CPU and the window's signals, then how each figure is read."""
    return [
        "Every component's CPU over the window (cores): "
        + ", ".join(f"{k} {v:.3f}" for k, v in r["cpu_cores_by_component"].items())
        + ".",
        "",
        "Signals in the window (Prometheus, queried after it closed): "
        + ", ".join(f"{k} {v}" for k, v in r["series_in_window"].items())
        + f"; batch sizes at the end {r['batch_sizes_at_end']}.",
        "",
        "How each figure is read: CPU is user + system time from `/proc/PID/stat` (all the "
        "operator's threads) between the window's ends; RSS is VmRSS / VmHWM at the end. Tick "
        f"latency: the window's bucket deltas of the operator's `{TICK_HISTOGRAM}` histogram "
        "(its /metrics), quantiles interpolated linearly inside a bucket as PromQL's "
        "`histogram_quantile` does, so they are only as fine as the buckets (5, 10, 25, 50, "
        "100, 250 ms, …). PromQL requests: the window's increase of Prometheus's own "
        f'`prometheus_http_requests_total{{handler="{QUERY_HANDLER}"}}` (all codes; nothing '
        "but the operator queries it during the window). A round is one `SignalsHub` fetch "
        "that serves every service ticking within the interval; rounds come from the operator's "
        "`wok_operator_promql_requests_total` ÷ the round's query count.",
        "",
        f"Window tick-latency buckets (le: count): {r['tick_buckets_window']}.",
    ]


def paused_figures(paused: dict[str, Any]) -> list[str]:
    """The paused-service run (e2e/test_operator_scale.py) beside this one."""
    return [
        "## Beside the paused-service figures",
        "",
        f"`operator_scale.json` (`{paused.get('command')}`): {paused.get('services')} paused "
        'services (maxReplicas 0, no pods, the "no ready replicas" path), '
        f"{paused.get('measured_s')} s: {paused.get('operator_cpu_cores')} cores, "
        f"{paused.get('promql_requests_per_tick')} PromQL requests per interval (counted by "
        f"the operator, when a round had {paused.get('queries_per_round')} queries).",
    ]


def per_label(quantiles: dict[str, dict[str, Any]] | None) -> str:
    """A table cell: `quantiles_by_label`'s figures, one line per label value."""
    return (
        "<br>".join(
            f"{value} {c['per_s']:.2f}/s, {ms(c['p50_s'])} / {ms(c['p99_s'])}"
            for value, c in (quantiles or {}).items()
        )
        or "–"
    )


def by_key(values: dict[str, float] | None, top: int = 8) -> str:
    """A table cell: the largest `top` values by key, one a line."""
    if not values:
        return "–"
    ranked = sorted(values.items(), key=lambda kv: -kv[1])[:top]
    return "<br>".join(f"{k} {v:g}" for k, v in ranked)


def ramp(r: dict[str, Any], key: str, fmt: str | None = None, *, top: int = 8) -> str:
    """A table cell from the run's ramp figures (runs before they were recorded have none)."""
    value = (r.get("ramp") or {}).get(key)
    if value is None:
        return "–"
    return fmt.format(value) if fmt else by_key(value, top)


def cores_cell(r: dict[str, Any], name: str) -> str:
    """A component's CPU cores in a run, `–` where the run did not measure it."""
    value = r["cpu_cores_by_component"].get(name)
    return "–" if value is None else f"{value:.3f}"


SCALE_INTRO = (
    "Every InferenceService has one KWOK-emulated pod; one process "
    "(`bench/operator/emulated_pod_metrics.py`) serves every pod's series of the runtime's "
    "metric "
    "contract on the pod's own IP, moving with time; Prometheus finds the pods through "
    "Kubernetes discovery and labels them itself; the real operator (`wok operator run "
    "--standalone`) runs its usual round. Figures over the measure window, after every "
    "service reads its signals (`--measure-s`)."
)
#: The rows of operator_scale.md: each a label and what a run shows in it.
SCALE_ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("control interval", lambda r: f"{r['interval_s']} s"),
    ("measured", lambda r: f"{r['measured_s']:.0f} s"),
    ("services reading signals (end)", lambda r: str(r["services_active_at_end"])),
    (
        "every pod ready, from the operator's start",
        lambda r: f"{r['pods_ready_s']:.0f} s" if "pods_ready_s" in r else "–",
    ),
    ("operator CPU", lambda r: f"{r['operator_cpu_cores']:.3f} cores"),
    (
        "operator RSS (peak)",
        lambda r: f"{r['operator_rss_mib']:.0f} ({r['operator_rss_peak_mib']:.0f}) MiB",
    ),
    ("ticks per service per interval", lambda r: f"{r['ticks_per_service_per_interval']:.2f}"),
    ("tick P50", lambda r: ms(r["tick_p50_s"])),
    ("tick P99", lambda r: ms(r["tick_p99_s"])),
    (
        "ticks that held without a fresh round",
        lambda r: str(r["ticks_without_signals"]) if "ticks_without_signals" in r else "–",
    ),
    (
        "the loops' API calls: per s, P50 / P99 by call",
        lambda r: per_label(r.get("kube_calls")),
    ),
    (
        "write lag (tick → landed): per s, P50 / P99 by kind",
        lambda r: per_label(r.get("write_lag")),
    ),
    ("PromQL requests/s", lambda r: f"{r['promql_requests_per_s']:.2f}"),
    ("PromQL requests per round", lambda r: str(r["promql_requests_per_round"])),
    ("Prometheus recording rules", lambda r: "yes" if r.get("recording_rules") else "no"),
    (
        "Prometheus query engine, wall s/s",
        lambda r: f"{r['prometheus_query_engine_cores']:.4f}",
    ),
    (
        "of which the operator's queries (HTTP), wall s/s",
        lambda r: (
            f"{r['prometheus_query_api_cores']:.4f}" if "prometheus_query_api_cores" in r else "–"
        ),
    ),
    (
        "of which rule evaluation, wall s/s",
        lambda r: (
            f"{r['prometheus_rule_evaluation_cores']:.4f}"
            if "prometheus_rule_evaluation_cores" in r
            else "–"
        ),
    ),
    ("Prometheus process CPU (scrapes too)", lambda r: f"{cores_cell(r, 'prometheus')} cores"),
    (
        "Prometheus CPU, operator stopped",
        lambda r: (
            f"{r['cpu_cores_operator_stopped']['prometheus']:.3f} cores"
            if r.get("cpu_cores_operator_stopped")
            else "–"
        ),
    ),
    (
        "Prometheus query CPU (the difference)",
        lambda r: (
            f"{r['prometheus_query_cpu_cores']:.3f} cores"
            if r.get("prometheus_query_cpu_cores") is not None
            else "–"
        ),
    ),
    (
        "status writes per service per minute",
        lambda r: f"{r['status_writes_per_service_per_min']:.3f}",
    ),
    (
        "status writes by cause, per service per minute",
        lambda r: by_key(r.get("status_writes_per_service_per_min_by_cause")),
    ),
    (
        "InferenceService status PATCHes/s",
        lambda r: f"{r['apiserver_status_patches_per_s']:.3f}",
    ),
    ("apiserver writes/s (all clients)", lambda r: f"{r['apiserver_writes_per_s']:.2f}"),
    ("watch events/s (all)", lambda r: f"{r['watch_events_per_s']:.2f}"),
    (
        "watch events/s (InferenceServices)",
        lambda r: f"{r['watch_events_inferenceservices_per_s']:.3f}",
    ),
    ("kube-apiserver CPU", lambda r: f"{cores_cell(r, 'kube-apiserver')} cores"),
    ("metrics source CPU", lambda r: f"{cores_cell(r, 'pod-metrics-source')} cores"),
    ("machine busy cores (of 2)", lambda r: f"{r['machine_busy_cores']:.2f}"),
    ("load average (1 min, median)", lambda r: f"{r['load1_median']:.2f}"),
    ("ramp: operator start to every pod ready", lambda r: ramp(r, "seconds", "{:.0f} s")),
    ("ramp: cores by component", lambda r: ramp(r, "cpu_cores_by_component", top=6)),
    ("ramp: machine busy cores (of 2)", lambda r: ramp(r, "machine_busy_cores", "{:.2f}")),
    ("ramp: apiserver writes/s", lambda r: ramp(r, "apiserver_writes_per_s", "{:.1f}")),
    (
        "ramp: apiserver writes by resource",
        lambda r: ramp(r, "apiserver_writes_by_resource", top=6),
    ),
    (
        "ramp: status writes by cause, per service per minute",
        lambda r: ramp(r, "status_writes_per_service_per_min_by_cause", top=6),
    ),
)


def scale_table(results: list[dict[str, Any]]) -> str:
    """bench/operator/results/operator_scale.md: emulated runs side by side, by the number of
    services."""
    results = sorted(results, key=lambda r: (r["services"], r.get("label") is None))
    labels = [r.get("label") or f"{r['services']} services" for r in results]
    lines = [
        "# Operator scale: emulated pods, a real apiserver, Prometheus and operator",
        "",
        SCALE_INTRO,
        "",
        "| | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(results),
        *(
            f"| {label} | " + " | ".join(cell(r) for r in results) + " |"
            for label, cell in SCALE_ROWS
        ),
        "",
        "Commands (each run also writes its JSON next to this file):",
        "",
        *[f"    {r['command']}" for r in results],
        "",
        *query_log_tables(results),
    ]
    notes = [note for r in results for note in r.get("notes") or []]
    if notes:
        lines += ["Notes:", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(lines)


def query_log_tables(results: list[dict[str, Any]]) -> list[str]:
    """Per run, the Prometheus query log's top queries by samples read (none where not logged)."""

    def cell(query: str) -> str:  # a table cell: a regex's `|` would end it
        return query[:120].replace("|", "\\|")

    lines: list[str] = []
    for r in results:
        top = (r.get("query_log") or {}).get("top_by_samples") or []
        if top:
            lines += [
                f"Prometheus' query log at {r['services']} services, the window's queries by "
                "samples read (the work; seconds are wall time on the loaded machine):",
                "",
                "| query | count | samples | seconds |",
                "|---|---|---|---|",
                *[
                    f"| `{cell(q['query'])}` | {q['count']} | {q['samples']} | {q['eval_s']} |"
                    for q in top
                ],
                "",
            ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--services", type=int, default=50)
    p.add_argument("--pods", type=int, default=2, help="pods per service (min = max)")
    p.add_argument("--rate", type=float, default=0.3, help="completions/s per service")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--interval", type=int, default=5, help="spec.scaling.intervalSeconds")
    p.add_argument("--load-seconds", type=float, default=5.0, help="runtime.simLoadSeconds")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--warmup-s", type=float, default=75.0, help="at least (rate windows fill)")
    p.add_argument("--warmup-max-s", type=float, default=300.0)
    p.add_argument("--measure-s", type=float, default=240.0)
    p.add_argument("--ready-timeout-s", type=float, default=900.0)
    p.add_argument("--deadline-s", type=int, default=2400, help="the whole run, at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--emulated",
        action="store_true",
        help="KWOK-emulated pods whose series come from one metrics source "
        "(bench/operator/emulated_pod_metrics.py), not runtime processes",
    )
    p.add_argument("--scrape-interval", default=SCRAPE_INTERVAL, help="Prometheus' (e.g. 15s)")
    p.add_argument(
        "--quiet-s",
        type=float,
        default=60.0,
        help="after the window, this long with the operator stopped: Prometheus' CPU without its "
        "queries (0: none)",
    )
    p.add_argument(
        "--no-recording-rules",
        action="store_true",
        help="Prometheus without the chart's recording rules (the round reads raw PromQL)",
    )
    p.add_argument("--keep", action="store_true", help="keep the run's files (logs)")
    p.add_argument("--render", action="store_true", help="only rewrite .md from .json (+ notes)")
    p.add_argument(
        "--table",
        type=Path,
        nargs="+",
        help="emulated runs' JSON → bench/operator/results/operator_scale.md",
    )
    p.add_argument("--note", action="append", default=[], help="a line for the notes")
    p.add_argument("--out", type=Path, default=RESULTS / "operator_scale_active")
    args = p.parse_args(argv)
    command = ".venv/bin/python bench/operator/operator_scale.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )

    if args.table:
        results = [json.loads(path.read_text()) for path in args.table]
        (RESULTS / "operator_scale.md").write_text(scale_table(results))
        return 0
    if args.render:  # the figures as they are, with --note lines added
        result = json.loads(args.out.with_suffix(".json").read_text())
        result["notes"] = [*result.get("notes", []), *args.note]
        return write(args.out, result)

    def out_of_time(*_: Any) -> None:
        raise Deadline(f"--deadline-s {args.deadline_s} ran out")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.signal(signal.SIGTERM, out_of_time)
    signal.alarm(args.deadline_s)
    try:
        result = run(args, command)
    finally:
        signal.alarm(0)
    return write(args.out, result)


def write(out: Path, result: dict[str, Any]) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    if result.get("settings", {}).get("emulated"):
        return 0  # `--table` renders emulated runs side by side
    paused_file = RESULTS / "operator_scale.json"
    paused = json.loads(paused_file.read_text()) if paused_file.exists() else None
    markdown = write_markdown(result, paused, out.with_suffix(".json").name)
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
