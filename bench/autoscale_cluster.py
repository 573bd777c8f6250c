"""wok against KEDA and the HPA on the emulated cluster: same pods, same trace, real controllers.

Why: `wok simulate` compares the law with HPA/KEDA algorithms written by us. This benchmark runs
the real thing: the operator and the runtime as processes, KEDA v2 (operator and metrics adapter,
from upstream) feeding the real HPA controller inside kube-controller-manager on a real apiserver,
a real Prometheus, and runtime pods on the simulated accelerator (`sim:llama-3-8b-80g`: the real
runtime, the analytic Llama-3-8B/H100 step times, a 60 s load), replaying a slice of the shared
Azure code trace with its clock kept (overlay-scaled).

Policies (each in its own namespace of one cluster; `--parallel` runs those of one invocation at
the same time):

- `keda-waiting`: the production-stack recipe: a KEDA ScaledObject with a Prometheus trigger on
  `sum(vllm:num_requests_waiting{namespace=…})`, threshold 5 (AverageValue), pollingInterval
  30 s with `useCachedMetrics` (the simulator's KEDA model), scaling the InferenceService itself
  through its scale subresource (`scaling.replicas: external`) at a fixed batch.
- `hpa-concurrency`: the HPA on concurrency per pod, running + waiting, target 32, through KEDA's
  Prometheus trigger with metricType AverageValue on the service's sum (the HPA divides it by
  the target, as a Pods metric averaged over pods would), read fresh at every 15 s HPA sync; the
  same fixed-batch rule.
- `wok`: the operator moves both knobs (its defaults).
- `wok-batch+keda`: `scaling.replicas: external`; KEDA as in `keda-waiting` owns the replicas,
  wok moves the batch.

The fixed batch of a fixed-batch policy is the simulator's best in hindsight for its twin on the
same slice (its sweep over B ∈ {16 … 256} ≤ B_mem), unless `--fixed-batch` names one. Every run
starts from the same ready fleet: the simulator's warm start for the slice (the planner's fleet
for the busiest minute of the first five), unless `--initial-replicas` says otherwise. The trace
is replayed against the ready pods through a least-outstanding-requests router (a gateway's job;
a refused connection or a 503 `draining`/`loading` is retried, up to three attempts, each on a
pod not tried yet). Per request, on the client, from its scheduled arrival: TTFT, TPOT (the mean
per output token after the first), E2E, status. Reported: SLO attainment (each and all
together), P99s, pod-hours (a pod counts from creation to deletion, pending included, within
the trace's span as the simulator counts them; with the tail until the last answer apart),
scale events, direction flips, 429s; the machine's load average during the run (other work
shares its cores); plots of load, pods and batch.

Beside each run: `wok simulate` on the same slice (written to a CSV in the trace's format), the
same rate scale, overlay mode, seed, SLOs, profile, warm start, max replicas, a cold start of
`--load-seconds`, least-loaded routing, for the simulator twin of the policy.

Results MERGE into `--out`.json (a run per policy, replaced when rerun); `.md` and `.png` are
regenerated from every run present.

    .venv/bin/python bench/autoscale_cluster.py --minutes 20 --policy keda-waiting,hpa-concurrency
    .venv/bin/python bench/autoscale_cluster.py --minutes 20 --policy wok
    .venv/bin/python bench/autoscale_cluster.py --minutes 20 --sim-only   # the simulator only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import datetime as dt
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from wok_cluster.apiserver import ControlPlane
from wok_cluster.binaries import BUILT, KEDA, Binaries, bin_dir, kubectl, missing
from wok_cluster.cluster import Cluster
from wok_cluster.keda import Keda
from wok_cluster.kubeapi import KubeApi, KubeError
from wok_cluster.netutil import free_port
from wok_cluster.prometheus import Prometheus
from wok_contracts.traces import TraceRequest, load_trace, scale_rate
from wok_runtime.bench_http import RequestResult, RequestSpec, send_completion
from wok_sim.baselines import WAITING_TARGET
from wok_sim.report import Slos, attainment, p99, slo_hits

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TRACE = ROOT / "bench" / "traces" / "azure_llm_2023_code.csv"
CRD = ROOT / "crds" / "wok.dev_inferenceservices.yaml"
PROFILE = "sim:llama-3-8b-80g"
MODEL = "llama-3-8b-80g"
NAME = "llama"
POLICIES = ("keda-waiting", "hpa-concurrency", "wok", "wok-batch+keda")
# the simulator's twin of each policy (none for wok on the batch beside KEDA on the replicas)
SIM_TWIN: dict[str, str | None] = {
    "keda-waiting": "keda-waiting",
    "hpa-concurrency": "hpa-concurrency-32",
    "wok": "wok",
    "wok-batch+keda": None,
}
FIXED_BATCH = {"keda-waiting", "hpa-concurrency"}
EXTERNAL = {"keda-waiting", "hpa-concurrency", "wok-batch+keda"}
CONCURRENCY_TARGET = 32  # per pod, the simulator's hpa-concurrency-32
SCRAPE_INTERVAL = "5s"  # Prometheus, as the simulator's --scrape-interval 5
SAMPLE_S = 1.0
RETRY_CODES = ("draining", "loading")  # 503s a gateway retries on another pod


@dataclass(frozen=True)
class Settings:
    minutes: float
    rate_scale: float
    max_replicas: int
    slo_ttft_s: float
    slo_tpot_s: float
    slo_e2e_s: float
    load_seconds: float
    seed: int
    profile: str = PROFILE
    rate_mode: str = "overlay"
    routing: str = "least-loaded"

    @property
    def horizon_s(self) -> float:
        return self.minutes * 60


# --- the trace slice, shared by the cluster and the simulator --------------------------------


def write_slice(s: Settings, path: Path) -> Path:
    """The first `minutes` of the Azure code trace, its rows as they are (a CSV `wok simulate
    --trace` reads the same way)."""
    with TRACE.open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    times = [dt.datetime.fromisoformat(r[0].strip()[:26]) for r in body]
    kept = [
        r for r, t in zip(body, times, strict=True) if (t - times[0]).total_seconds() < s.horizon_s
    ]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(kept)
    return path


def slice_requests(s: Settings, slice_csv: Path) -> list[TraceRequest]:
    """The slice as `wok simulate` builds it: read, then overlay-scaled with the seed."""
    requests = load_trace(str(slice_csv), seed=s.seed)
    if s.rate_scale != 1.0:
        requests = scale_rate(requests, s.rate_scale, mode=s.rate_mode, seed=s.seed)
    return requests


def start_replicas(s: Settings, requests: list[TraceRequest]) -> int:
    """The simulator's warm start for these requests (every autoscaler there starts from it)."""
    from wok_contracts.profile import load_profile
    from wok_sim.plan import warm_start

    slos = Slos(s.slo_ttft_s, s.slo_tpot_s, s.slo_e2e_s)
    return warm_start(load_profile(s.profile), requests, slos)


def request_specs(s: Settings, requests: list[TraceRequest]) -> list[RequestSpec]:
    """What the client sends: lengths clipped as the simulator and the runtime clip them."""
    from wok_contracts.profile import load_profile
    from wok_contracts.traces import clip_to_model

    clipped, _ = clip_to_model(requests, load_profile(s.profile).max_model_len)
    return [RequestSpec(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in clipped]


# --- the simulator beside the cluster ----------------------------------------------------------


def simulate(s: Settings, slice_csv: Path, twins: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`wok simulate --json` for the twins; returns their results and the command."""
    command = [
        str(ROOT / ".venv" / "bin" / "wok"),
        "simulate",
        f"--trace={slice_csv}",
        f"--rate-scale={s.rate_scale:g}",
        f"--rate-mode={s.rate_mode}",
        f"--duration={s.horizon_s:g}",
        f"--cold-start={s.load_seconds:g}",
        f"--slo-ttft={s.slo_ttft_s:g}",
        f"--slo-tpot={s.slo_tpot_s:g}",
        f"--slo-e2e={s.slo_e2e_s:g}",
        f"--profile={s.profile}",
        f"--routing={s.routing}",
        f"--scrape-interval={SCRAPE_INTERVAL.removesuffix('s')}",
        f"--max-replicas={s.max_replicas}",
        f"--seed={s.seed}",
        f"--policy={','.join(twins)}",
        "--json",
        "--jobs=1",
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wok simulate failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout)["policies"]
    wall = time.monotonic() - started
    today = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for result in out.values():
        result["date"] = today
        result["wall_s_all_twins"] = round(wall, 1)
    return out, command


# --- the cluster run ---------------------------------------------------------------------------


def service_spec(policy: str, s: Settings, initial: int, fixed_batch: int | None) -> dict:
    """The InferenceService of a run: the same pods for every policy; who owns which knob."""
    spec: dict[str, Any] = {
        "model": {"source": s.profile, "preset": "llama-3-8b", "dtype": "bfloat16"},
        # the defaults otherwise (queue 256 / 30 s, drain 30 s), as the simulator's
        "runtime": {
            "gpuMemory": "80Gi",
            "cpu": "250m",
            "memory": "256Mi",
            "simLoadSeconds": s.load_seconds,
        },
        # the profile's context: the code trace's prompts run to 7,437 tokens
        "memory": {"maxModelLen": 8192},
        "scaling": {
            "minReplicas": initial,
            "maxReplicas": s.max_replicas,
            "podStartSeconds": round(s.load_seconds),
        },
        "slo": {
            "ttftP99Seconds": s.slo_ttft_s,
            "tpotP99Seconds": s.slo_tpot_s,
            "e2eP99Seconds": s.slo_e2e_s,
        },
    }
    if policy in EXTERNAL:
        spec["replicas"] = initial
        spec["scaling"] = {**spec["scaling"], "replicas": "external", "minReplicas": 1}
    if fixed_batch is not None:
        b = fixed_batch
        spec["batching"] = {"minBatchSize": b, "initialBatchSize": b, "maxBatchSize": b}
    return spec


def scaled_object(policy: str, namespace: str, prometheus_url: str, s: Settings) -> dict:
    """KEDA's ScaledObject on the InferenceService's scale subresource; HPA default behaviour."""
    selector = f'{{namespace="{namespace}"}}'
    if policy == "hpa-concurrency":
        trigger = {
            "type": "prometheus",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": prometheus_url,
                "query": f"sum(vllm:num_requests_running{selector})"
                f" + sum(vllm:num_requests_waiting{selector})",
                "threshold": str(CONCURRENCY_TARGET),
            },
        }
        polling = 15
    else:
        trigger = {
            "type": "prometheus",
            "metricType": "AverageValue",
            "useCachedMetrics": True,
            "metadata": {
                "serverAddress": prometheus_url,
                "query": f"sum(vllm:num_requests_waiting{selector})",
                "threshold": f"{WAITING_TARGET:g}",
            },
        }
        polling = 30
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "wok.dev/v1alpha1",
                "kind": "InferenceService",
                "name": NAME,
            },
            "pollingInterval": polling,
            "minReplicaCount": 1,
            "maxReplicaCount": s.max_replicas,
            "triggers": [trigger],
        },
    }


@dataclass
class Fleet:
    """The runtime pods as the apiserver lists them, polled every second: where to route, the
    pod-seconds the run pays for, the timeline, the machine's load."""

    api: KubeApi
    namespace: str
    horizon_s: float
    ready: list[str] = field(default_factory=list)
    outstanding: dict[str, int] = field(default_factory=dict)
    pod_seconds: float = 0.0  # within [0, horizon_s], as the simulator bills
    pod_seconds_total: float = 0.0  # until the last answer
    timeline: list[dict[str, Any]] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    send_late: list[float] = field(default_factory=list)  # s after the arrival, first attempts
    decisions: Path | None = None  # each new status.lastDecision appended, one JSON a line
    _last: tuple[float, int] | None = None
    _last_decision: str | None = None

    def list_pods(self) -> list[dict]:
        pods = self.api.get(
            f"/api/v1/namespaces/{self.namespace}/pods", labelSelector=f"wok.dev/service={NAME}"
        )["items"]
        alive = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        self.ready = [
            p["status"]["podIP"]
            for p in alive
            if p["status"].get("podIP")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions", [])
            )
        ]
        return pods

    def refresh(self, t: float) -> None:
        """One sample at `t` seconds into the replay."""
        pods = self.list_pods()
        if self._last is not None:  # the count held since the last sample
            t0, n = self._last
            self.pod_seconds_total += n * (t - t0)
            self.pod_seconds += n * max(0.0, min(t, self.horizon_s) - min(t0, self.horizon_s))
        self._last = (t, len(pods))
        self.load.append(os.getloadavg()[0])
        wis = self.api.get(
            f"/apis/wok.dev/v1alpha1/namespaces/{self.namespace}/inferenceservices/{NAME}"
        )
        deployment = self.api.get(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{NAME}-runtime"
        )
        decision = wis.get("status", {}).get("lastDecision")
        if self.decisions is not None and decision and decision["time"] != self._last_decision:
            # the operator's reasons, kept for after the run (its namespace goes with it)
            self._last_decision = decision["time"]
            with self.decisions.open("a") as out:
                out.write(json.dumps({"t": round(t, 1), **decision}) + "\n")
        self.timeline.append(
            {
                "t": round(t, 1),
                "pods": len(pods),
                "ready": len(self.ready),
                "replicas": deployment["spec"]["replicas"],
                "wis_replicas": wis["spec"].get("replicas"),
                "batch": wis.get("status", {}).get("batchSize"),
                "in_flight": sum(self.outstanding.values()),
                "load1": round(self.load[-1], 2),
            }
        )

    def pick(self, tried: Collection[str] = ()) -> str | None:
        """The ready pod with the fewest requests in flight from this client, none of `tried`:
        a retry goes to another pod, as a gateway's does (Envoy's `previous_hosts` predicate).
        Otherwise a pod that has closed its listener to drain, with nothing in flight, is the
        least loaded and takes every retry until the next poll."""
        candidates = [ip for ip in self.ready if ip not in tried]
        if not candidates:
            return None
        return min(candidates, key=lambda ip: (self.outstanding.get(ip, 0), random.random()))


def _retryable(result: RequestResult) -> bool:
    if result.status == 0 and result.error and "ConnectError" in result.error:
        return True  # a pod that just went away
    return result.status == 503 and any(c in (result.body or "") for c in RETRY_CODES)


async def replay(
    fleet: Fleet, specs: list[RequestSpec], seed: int, tag: str
) -> tuple[list[RequestResult], float]:
    """Sends every request at its arrival; latencies count from the arrival (a wait for a ready
    pod or a retry is the user's wait too). Returns the results and the replay's seconds."""
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=400)
    rng = random.Random(seed)
    results = [RequestResult(expected_tokens=s.output_len) for s in specs]
    started = time.perf_counter()
    done = 0

    async def poll() -> None:
        last_log = 0.0
        while True:
            t = time.perf_counter() - started
            try:
                await asyncio.to_thread(fleet.refresh, t)
            except (KubeError, httpx.HTTPError) as error:
                print(f"[{tag}] poll failed: {error!r}"[:300], file=sys.stderr)
            if t - last_log >= 60:
                last_log = t
                row = fleet.timeline[-1] if fleet.timeline else {}
                print(
                    f"[{tag}] t={t:5.0f} s done {done}/{len(specs)} pods {row.get('pods')} "
                    f"ready {row.get('ready')} batch {row.get('batch')} load {row.get('load1')}",
                    file=sys.stderr,
                    flush=True,
                )
            await asyncio.sleep(SAMPLE_S)

    async def send(i: int, spec: RequestSpec, client: httpx.AsyncClient) -> None:
        nonlocal done
        await asyncio.sleep(max(0.0, spec.send_at - (time.perf_counter() - started)))
        result = RequestResult(expected_tokens=spec.output_len, error="no ready pod")
        attempts = 0
        tried: set[str] = set()
        for _ in range(3):
            ip = fleet.pick(tried)
            if ip is None:
                await asyncio.sleep(0.5)
                continue
            tried.add(ip)
            fleet.outstanding[ip] = fleet.outstanding.get(ip, 0) + 1
            late = time.perf_counter() - started - spec.send_at
            if not attempts:  # how late the client itself was (a starved event loop)
                fleet.send_late.append(late)
            attempts += 1
            try:
                result = await send_completion(client, f"http://{ip}:8000", MODEL, spec, rng)
            finally:
                fleet.outstanding[ip] -= 1
            if result.ttft_s is not None:
                result.ttft_s += late
            if result.e2e_s is not None:
                result.e2e_s += late
            if not _retryable(result):
                break
        results[i] = result
        done += 1

    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as client:
        poller = asyncio.create_task(poll())
        await asyncio.gather(*(send(i, spec, client) for i, spec in enumerate(specs)))
        # the fleet bills until the trace's span ends, as in the simulator, even when the last
        # answer came earlier
        await asyncio.sleep(max(0.0, fleet.horizon_s - (time.perf_counter() - started)))
        await asyncio.to_thread(fleet.refresh, time.perf_counter() - started)
        poller.cancel()
    return results, time.perf_counter() - started


def summarize(results: list[RequestResult], fleet: Fleet, s: Settings) -> dict[str, Any]:
    """As `wok_sim.report.summarize` counts: every request in the denominator, misses included."""
    n = len(results)

    slos = Slos(s.slo_ttft_s, s.slo_tpot_s, s.slo_e2e_s)
    hits = [slo_hits(slos, r.ttft_s, r.tpot_s, r.e2e_s) for r in results if r.ok]
    ttft, tpot, e2e, slo = attainment(hits, n)
    replicas = [row["replicas"] for row in fleet.timeline]
    directions = [b > a for a, b in itertools.pairwise(replicas) if b != a]
    flips = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    ok = [r for r in results if r.ok]
    return {
        "requests": n,
        "slo_attainment": slo,
        "ttft_attainment": ttft,
        "tpot_attainment": tpot,
        "e2e_attainment": e2e,
        "p99_ttft_s": p99([r.ttft_s for r in ok if r.ttft_s is not None]),
        "p99_tpot_s": p99([t for r in ok if (t := r.tpot_s) is not None]),
        "p99_e2e_s": p99([r.e2e_s for r in ok if r.e2e_s is not None]),
        "pod_hours": fleet.pod_seconds / 3600,
        "pod_hours_with_tail": fleet.pod_seconds_total / 3600,
        "scale_events": len(directions),
        "flips": flips,
        "rejected": sum(1 for r in results if r.status == 429),
        "timeouts": sum(
            1 for r in results if r.status == 503 and "queue_timeout" in (r.body or "")
        ),
        "failed": sum(1 for r in results if not r.ok and r.status != 429),
        "max_replicas": max(replicas, default=0),
        "failure_reasons": Counter(
            f"{r.status} {r.error or (r.body or '')[:80]}"[:120]
            for r in results
            if not r.ok and r.status != 429
        ).most_common(5),
        "client_send_late_p50_s": statistics.median(fleet.send_late) if fleet.send_late else None,
        "client_send_late_p99_s": p99(fleet.send_late),
        "load_avg_median": statistics.median(fleet.load) if fleet.load else None,
        "load_avg_max": max(fleet.load, default=None),
    }


class Operator:
    """`wok operator run` against the cluster, standalone, for one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str, prometheus_url: str, log: Path) -> None:
        args = [
            str(ROOT / ".venv" / "bin" / "wok"),
            "operator",
            "run",
            f"--namespace={namespace}",
            f"--prometheus-url={prometheus_url}",
            "--pod-label=wok.dev/backed=true",
            f"--metrics-port={free_port()}",
            "--metrics-host=127.0.0.1",
            # its own port: the default (0.0.0.0:8080) would collide between parallel runs
            f"--liveness=http://127.0.0.1:{free_port()}/healthz",
            "--standalone",
            "--log-format=plain",
        ]
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            )

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)


def wait_until(probe: Any, what: str, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except (KubeError, httpx.HTTPError) as error:
            last = error
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what} (last error: {last!r})")
        time.sleep(interval)


def hpa_events(api: KubeApi, namespace: str) -> list[str]:
    events = api.get(
        f"/api/v1/namespaces/{namespace}/events",
        fieldSelector=f"involvedObject.name=keda-hpa-{NAME},reason=SuccessfulRescale",
    )["items"]
    return [e["message"] for e in events]


def run_policy(
    policy: str,
    plane: ControlPlane,
    prometheus: Prometheus,
    s: Settings,
    specs: list[RequestSpec],
    initial: int,
    fixed_batch: int | None,
    run_dir: Path,
) -> dict[str, Any]:
    started_wall = time.monotonic()
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    namespace = f"bench-{policy.replace('+', '-')}"
    kc = plane.kubeconfig
    wis_path = f"/apis/wok.dev/v1alpha1/namespaces/{namespace}/inferenceservices/{NAME}"
    so_path = f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects/{NAME}"
    hpa_path = (
        f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/keda-hpa-{NAME}"
    )
    with plane.api() as api:
        api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        operator = Operator(kc, namespace, prometheus.url, run_dir / f"operator-{namespace}.log")
        try:
            doc = {
                "apiVersion": "wok.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": NAME},
                "spec": service_spec(policy, s, initial, fixed_batch),
            }
            applied = kubectl(kc, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(doc))
            if applied.returncode != 0:
                raise RuntimeError(f"kubectl apply: {applied.stderr}")
            decisions = run_dir / f"decisions-{namespace}.jsonl"
            fleet = Fleet(api, namespace, s.horizon_s, decisions=decisions)
            print(f"[{policy}] waiting for {initial} ready pods", file=sys.stderr, flush=True)

            def fleet_ready() -> bool:
                if operator.popen.poll() is not None:
                    raise RuntimeError(f"the operator exited ({operator.popen.returncode})")
                fleet.list_pods()
                return len(fleet.ready) >= initial

            wait_until(
                fleet_ready,
                "the initial fleet",
                s.load_seconds + 240,
            )
            ready_s = time.monotonic() - started_wall
            if policy == "wok":
                # The same start for every policy; from here on the law may go down to one pod.
                api.patch(wis_path, {"spec": {"scaling": {"minReplicas": 1}}})
            if policy in EXTERNAL:
                api.create(
                    f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects",
                    scaled_object(policy, namespace, prometheus.url, s),
                )
                wait_until(lambda: api.get(hpa_path), "KEDA's HPA", 60)
            print(
                f"[{policy}] fleet ready after {ready_s:.0f} s; replaying {len(specs)} requests"
                f" over {s.minutes:g} min",
                file=sys.stderr,
                flush=True,
            )
            results, replay_s = asyncio.run(replay(fleet, specs, s.seed, policy))
            summary = summarize(results, fleet, s)
            if policy in EXTERNAL:
                summary["hpa_rescales"] = hpa_events(api, namespace)
                hpa = api.get(hpa_path)
                summary["hpa_conditions"] = [
                    f"{c['type']}={c['status']} {c.get('reason', '')}"
                    for c in hpa.get("status", {}).get("conditions", [])
                ]
            summary.update(
                {
                    "date": date,
                    "wall_s": round(time.monotonic() - started_wall, 1),
                    "replay_s": round(replay_s, 1),
                    "fleet_ready_s": round(ready_s, 1),
                    "initial_replicas": initial,
                    "fixed_batch": fixed_batch,
                    "namespace": namespace,
                    "settings": asdict(s),
                    "timeline": fleet.timeline,
                }
            )
            return summary
        finally:
            if policy in EXTERNAL:
                with contextlib.suppress(KubeError):
                    api.delete(so_path)
            operator.stop()
            kubectl(kc, "delete", "namespace", namespace, "--wait=false")


# --- the report --------------------------------------------------------------------------------


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def sec(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def write_markdown(data: dict[str, Any]) -> str:
    s = Settings(**data["settings"])
    runs: dict[str, dict] = data.get("runs", {})
    sims: dict[str, dict] = data.get("simulator", {})
    ordered = [p for p in POLICIES if p in runs]
    lines = [
        "# wok against KEDA and the HPA on the emulated cluster",
        "",
        "Made by `bench/autoscale_cluster.py`; every invocation merges its runs into "
        "`autoscale_cluster.json` and rewrites this file and the plot from all runs present. "
        "Commands:",
        "",
        *(f"- `{c}`" for c in data.get("commands", [])),
        "",
        f"**Set-up.** The first {s.minutes:g} min of the shared Azure code trace, "
        f"{s.rate_mode} ×{s.rate_scale:g} (seed {s.seed}), replayed with its clock against "
        f"an InferenceService on `{s.profile}` pods (the real runtime on the simulated "
        f"accelerator, {s.load_seconds:g} s load), on the emulated cluster (real kube-apiserver, "
        "kube-controller-manager with its HPA controller, KEDA v2 from upstream, Prometheus "
        f"scraping every {SCRAPE_INTERVAL}). SLOs: TTFT {s.slo_ttft_s:g} s, mean TPOT "
        f"{s.slo_tpot_s:g} s, E2E {s.slo_e2e_s:g} s, on the client, from each request's "
        "scheduled arrival; 429s, timeouts and failures miss all three. Every run starts from "
        "the same ready fleet, the simulator's warm start for the slice; at most "
        f"{s.max_replicas} replicas. Requests go to the ready pod with the fewest in flight "
        "(the simulator's `least-loaded`); a refused connection or a 503 `draining`/`loading` "
        "is retried on a pod not tried yet, at most three attempts. Pod-hours count every pod "
        "from creation to deletion, pending and terminating included, within the trace's span "
        "(as the simulator bills; "
        "with the tail until the last answer in the JSON).",
        "",
        "- `keda-waiting`: KEDA ScaledObject, Prometheus trigger "
        f"`sum(vllm:num_requests_waiting{{namespace=…}})`, threshold {WAITING_TARGET:g} "
        "(AverageValue), pollingInterval 30 s, `useCachedMetrics` (the simulator's KEDA "
        "model), HPA default behaviour, on the InferenceService's scale subresource "
        "(`scaling.replicas: external`), fixed batch.",
        "- `hpa-concurrency`: the same path, query `sum(running) + sum(waiting)`, AverageValue "
        f"target {CONCURRENCY_TARGET} per pod, read at every 15 s HPA sync; fixed batch.",
        "- `wok`: the operator moves batch and replicas (defaults; podStartSeconds "
        f"{round(s.load_seconds)}).",
        "- `wok-batch+keda`: KEDA as in `keda-waiting` owns the replicas, wok moves the batch.",
        "",
        "Fixed batches: the simulator's best in hindsight for the policy's twin on this slice.",
        "",
        "## On the cluster",
        "",
        "| policy | all SLOs | TTFT | TPOT | E2E | P99 TTFT s | P99 TPOT s | P99 E2E s | pod-h |"
        " scale events | flips | 429 | timeouts | failed | max R | B |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy in ordered:
        r = runs[policy]
        lines.append(
            f"| {policy} | {pct(r['slo_attainment'])} | {pct(r['ttft_attainment'])} | "
            f"{pct(r['tpot_attainment'])} | {pct(r['e2e_attainment'])} | {sec(r['p99_ttft_s'])} | "
            f"{r['p99_tpot_s']:.3f} | {sec(r['p99_e2e_s'])} | {r['pod_hours']:.2f} | "
            f"{r['scale_events']} | {r['flips']} | {r['rejected']} | {r.get('timeouts', '–')} | "
            f"{r['failed']} | "
            f"{r['max_replicas']} | {r['fixed_batch'] or 'wok'} |"
        )
    lines += [
        "",
        "## Beside the simulator",
        "",
        "`wok simulate` on the same slice (written to a CSV in the trace's format), same rate "
        f"scale, mode, seed, SLOs, profile, warm start and max replicas, `--cold-start "
        f"{s.load_seconds:g} --routing least-loaded --scrape-interval 5 --duration "
        f"{s.horizon_s:g}`. Target: within 3 points of attainment and 10 % of pod-hours.",
        "",
        "| policy | simulator twin | B cluster / sim | all SLOs cluster | sim | Δ points |"
        " pod-h cluster | sim | Δ % | within target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy in ordered:
        r = runs[policy]
        twin = SIM_TWIN[policy]
        if twin is None or twin not in sims:
            lines.append(
                f"| {policy} | none (the simulator has no policy with wok on the batch and KEDA "
                f"on the replicas) | – | {pct(r['slo_attainment'])} | – | – | "
                f"{r['pod_hours']:.2f} | – | – | – |"
            )
            continue
        m = sims[twin]
        d_att = 100 * (r["slo_attainment"] - m["slo_attainment"])
        d_pod = (
            100 * (r["pod_hours"] - m["gpu_hours"]) / m["gpu_hours"] if m["gpu_hours"] else math.nan
        )
        ok = abs(d_att) <= 3 and abs(d_pod) <= 10
        lines.append(
            f"| {policy} | {twin} | {r['fixed_batch'] or 'wok'} / {m.get('batch_size') or 'wok'} |"
            f" {pct(r['slo_attainment'])} | {pct(m['slo_attainment'])} | {d_att:+.1f} | "
            f"{r['pod_hours']:.2f} | {m['gpu_hours']:.2f} | {d_pod:+.1f} % | "
            f"{'yes' if ok else 'no'} |"
        )
    lines += [
        "",
        "Simulator, more columns:",
        "",
        "| twin | all SLOs | TTFT | TPOT | E2E | GPU-h | P99 TTFT s | P99 E2E s | scale events |"
        " flips | rejected | timeouts | B | simulated on |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for twin, m in sorted(sims.items()):
        lines.append(
            f"| {twin} | {pct(m['slo_attainment'])} | {pct(m['ttft_attainment'])} | "
            f"{pct(m['tpot_attainment'])} | {pct(m['e2e_attainment'])} | {m['gpu_hours']:.2f} | "
            f"{sec(m['p99_ttft_s'])} | {sec(m['p99_e2e_s'])} | "
            f"{m['scale_events']} | {m['flips']} | {m['rejected']} | {m['timeouts']} | "
            f"{m.get('batch_size') or 'wok'} | {m.get('date', '?')} |"
        )
    lines += [
        "",
        "## The runs",
        "",
        "Wall time: the whole run (namespace, fleet start, replay, read-out); the machine's "
        "1-minute load average sampled every second during the replay (2 cores, shared with "
        "other work); client late: how long after its arrival the client sent a request (its "
        "own event loop's lag, counted in the latencies); run beside: the runs of the same "
        "invocation that shared the cluster and the cores at the same time.",
        "",
        "| policy | date (UTC) | wall s | replay s | fleet ready s | load avg median / max |"
        " client late P99 s | run beside | requests | initial R | HPA rescales |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy in ordered:
        r = runs[policy]
        rescales = len(r.get("hpa_rescales", [])) if "hpa_rescales" in r else "–"
        beside = ", ".join(r.get("parallel_with", [])) or "–"
        lines.append(
            f"| {policy} | {r['date']} | {r['wall_s']:.0f} | {r['replay_s']:.0f} | "
            f"{r['fleet_ready_s']:.0f} | {r['load_avg_median']:.2f} / {r['load_avg_max']:.2f} | "
            f"{sec(r.get('client_send_late_p99_s'))} | {beside} | "
            f"{r['requests']} | {r['initial_replicas']} | {rescales} |"
        )
    notes = data.get("notes", [])
    if notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], specs: list[RequestSpec] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data.get("runs", {})
    fig, (ax_l, ax_r, ax_b) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    if specs:
        minutes = Counter(int(sp.send_at // 60) for sp in specs)
        xs = sorted(minutes)
        ax_l.step([x for x in xs], [minutes[x] / 60 for x in xs], where="post", color="gray")
    ax_l.set_ylabel("arrivals / s (per minute)")
    for policy in POLICIES:
        if policy not in runs:
            continue
        timeline = runs[policy]["timeline"]
        t = [row["t"] / 60 for row in timeline]
        ax_r.plot(t, [row["pods"] for row in timeline], label=policy)
        ax_b.plot(t, [row["batch"] or 0 for row in timeline], label=policy)
    ax_r.set_ylabel("pods (pending included)")
    ax_b.set_ylabel("batch size")
    ax_b.set_xlabel("minutes into the trace")
    ax_r.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main --------------------------------------------------------------------------------------


def load_results(path: Path, s: Settings) -> dict[str, Any]:
    if not path.exists():
        return {"settings": asdict(s), "runs": {}, "simulator": {}, "commands": []}
    data = json.loads(path.read_text())
    if data.get("settings") != asdict(s):
        raise SystemExit(
            f"{path} holds runs with other settings ({data.get('settings')}); pass the same "
            "settings, another --out, or --replace to start it over"
        )
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="all", help=f"all, or a comma list of {', '.join(POLICIES)}")
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--rate-scale", type=float, default=3.0)
    p.add_argument("--initial-replicas", type=int, help="default: the simulator's warm start")
    p.add_argument("--max-replicas", type=int, default=12)
    p.add_argument(
        "--fixed-batch", type=int, help="the fixed-batch policies' B (default: the sim's best)"
    )
    p.add_argument("--load-seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", action="store_true", help="this invocation's runs at once")
    p.add_argument("--sim-only", action="store_true", help="the simulator's twins only")
    p.add_argument("--replace", action="store_true", help="drop the results file's old runs")
    p.add_argument("--note", action="append", default=[], help="a line for the notes")
    p.add_argument(
        "--rewrite", action="store_true", help="only add the notes and rewrite .md and .png"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "autoscale_cluster")
    args = p.parse_args(argv)
    policies = POLICIES if args.policy == "all" else tuple(args.policy.split(","))
    unknown = [x for x in policies if x not in POLICIES]
    if unknown:
        p.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    settings = Settings(
        minutes=args.minutes,
        rate_scale=args.rate_scale,
        max_replicas=args.max_replicas,
        slo_ttft_s=2.0,
        slo_tpot_s=0.1,
        slo_e2e_s=5.0,
        load_seconds=args.load_seconds,
        seed=args.seed,
    )
    json_path = args.out.with_suffix(".json")
    if args.replace and json_path.exists():
        json_path.unlink()
    data = load_results(json_path, settings)
    command = "python bench/autoscale_cluster.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    run_dir = Path(tempfile.mkdtemp(prefix="wok-bench-cluster-"))
    slice_csv = write_slice(settings, run_dir / "slice.csv")
    requests = slice_requests(settings, slice_csv)
    specs = request_specs(settings, requests)
    initial = args.initial_replicas or start_replicas(settings, requests)
    print(
        f"{len(specs)} requests in {settings.minutes:g} min, warm start {initial} replicas;"
        f" run files in {run_dir}",
        file=sys.stderr,
    )

    twins = sorted({t for x in policies if (t := SIM_TWIN[x]) is not None})
    if args.rewrite:
        policies, twins = (), []
        args.sim_only = True
    if twins:
        print(f"simulating {', '.join(twins)}", file=sys.stderr, flush=True)
        sims, sim_command = simulate(settings, slice_csv, twins)
        data.setdefault("simulator", {}).update(sims)
        data["simulator_command"] = " ".join(
            "--trace=<the slice CSV>" if a.startswith("--trace=") else a
            for a in [Path(sim_command[0]).name, *sim_command[1:]]
        )
        for twin in twins:
            m = sims[twin]
            print(
                f"sim {twin}: {100 * m['slo_attainment']:.1f} % SLOs, {m['gpu_hours']:.2f} "
                f"GPU-h, B {m['batch_size']}",
                file=sys.stderr,
            )

    if not args.sim_only:
        needed = BUILT + KEDA if any(x in EXTERNAL for x in policies) else BUILT
        if missing(needed):
            raise SystemExit(
                f"{missing(needed)} not built in {bin_dir()}: run cluster/build.sh first"
            )
        batches = {
            x: (args.fixed_batch or data["simulator"][SIM_TWIN[x]]["batch_size"])
            if x in FIXED_BATCH
            else None
            for x in policies
        }
        nodes = math.ceil((len(policies) if args.parallel else 1) * args.max_replicas / 8)
        plane = ControlPlane(run_dir, Binaries(bin_dir()))
        cluster = Cluster(plane, nodes=max(2, nodes), gpus_per_node=8)
        prometheus = Prometheus(plane, run_dir / "prometheus", interval=SCRAPE_INTERVAL)
        keda = Keda(plane, run_dir / "keda")
        runs: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        keda_started = False
        try:
            plane.start()
            cluster.start()
            prometheus.start()
            applied = kubectl(plane.kubeconfig, "apply", "--server-side", "-f", str(CRD))
            if applied.returncode != 0:
                raise RuntimeError(applied.stderr)
            if any(x in EXTERNAL for x in policies):
                keda_started = True
                keda.start()

            def one(policy: str) -> None:
                try:
                    runs[policy] = run_policy(
                        policy,
                        plane,
                        prometheus,
                        settings,
                        specs,
                        initial,
                        batches[policy],
                        run_dir,
                    )
                    short = {
                        k: v for k, v in runs[policy].items() if k not in ("timeline", "settings")
                    }
                    print(json.dumps(short), file=sys.stderr, flush=True)
                except Exception as error:  # one policy's failure must not lose the others
                    errors[policy] = repr(error)
                    print(f"[{policy}] FAILED: {error!r}", file=sys.stderr, flush=True)

            if args.parallel:
                threads = [threading.Thread(target=one, args=(x,)) for x in policies]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            else:
                for policy in policies:
                    one(policy)
        finally:
            if keda_started:
                keda.stop()
            prometheus.stop()
            cluster.stop()
            plane.stop()
        for policy, result in runs.items():
            result["command"] = command
            result["parallel_with"] = [x for x in runs if x != policy] if args.parallel else []
            data["runs"][policy] = result
        if errors:
            print(f"failed: {errors}", file=sys.stderr)
    data.setdefault("commands", [])
    if command not in data["commands"] and not args.rewrite:
        data["commands"].append(command)
    data.setdefault("notes", [])
    data["notes"] += [n for n in args.note if n not in data["notes"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    markdown = write_markdown(data)
    args.out.with_suffix(".md").write_text(markdown)
    plot(data, specs, args.out.with_suffix(".png"))
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
