"""The cluster benchmark's client: a least-outstanding-requests router over the ready pods that
replays the trace slice on its clock, samples the fleet, and sums up each run
(bench/autoscaling/autoscale_cluster.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from autoscale_settings import (
    MODEL,
    NAME,
    RETRY_CODES,
    SAMPLE_S,
    VLLM_BUSY,
    Settings,
)

from wok_cluster.kubeapi import KubeApi, KubeError
from wok_contracts.slos import Slos
from wok_contracts.traces import TraceRequest
from wok_runtime.tools.bench_http import RequestResult, send_completion
from wok_sim.report import attainment, p99, slo_hits


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
    fleet: Fleet, specs: list[TraceRequest], seed: int, tag: str
) -> tuple[list[RequestResult], float]:
    """Sends every request at its arrival; latencies count from the arrival (a wait for a ready
    pod or a retry is the user's wait too). Returns the results and the replay's seconds."""
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=400)
    rng = random.Random(seed)
    results = [RequestResult(expected_tokens=s.output_tokens) for s in specs]
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

    async def send(i: int, spec: TraceRequest, client: httpx.AsyncClient) -> None:
        nonlocal done
        await asyncio.sleep(max(0.0, spec.arrival_s - (time.perf_counter() - started)))
        result = RequestResult(expected_tokens=spec.output_tokens, error="no ready pod")
        attempts = 0
        tried: set[str] = set()
        for _ in range(3):
            ip = fleet.pick(tried)
            if ip is None:
                await asyncio.sleep(0.5)
                continue
            tried.add(ip)
            fleet.outstanding[ip] = fleet.outstanding.get(ip, 0) + 1
            late = time.perf_counter() - started - spec.arrival_s
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


def _refused(result: RequestResult) -> bool:
    """wok's 429 queue_full, or vLLM's 503 past --max-num-queued-reqs."""
    return result.status == 429 or (result.status == 503 and VLLM_BUSY in (result.body or ""))


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
        "rejected": sum(1 for r in results if _refused(r)),
        "timeouts": sum(
            1 for r in results if r.status == 503 and "queue_timeout" in (r.body or "")
        ),
        "failed": sum(1 for r in results if not r.ok and not _refused(r)),
        "max_replicas": max(replicas, default=0),
        "failure_reasons": Counter(
            f"{r.status} {r.error or (r.body or '')[:80]}"[:120]
            for r in results
            if not r.ok and not _refused(r)
        ).most_common(5),
        "client_send_late_p50_s": statistics.median(fleet.send_late) if fleet.send_late else None,
        "client_send_late_p99_s": p99(fleet.send_late),
        "load_avg_median": statistics.median(fleet.load) if fleet.load else None,
        "load_avg_max": max(fleet.load, default=None),
    }
