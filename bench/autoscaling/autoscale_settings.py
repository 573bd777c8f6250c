"""The cluster benchmark's settings and constants, and the trace slice that the cluster and
the simulator both replay (bench/autoscaling/autoscale_cluster.py)."""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from wok_contracts.slos import Slos
from wok_contracts.traces import TraceRequest, load_trace, scale_rate

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "autoscaling" / "results"
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
#: `--engine vllm`: the pods' model path (the fake vLLM pod ignores it: the profile is the model)
VLLM_MODEL_PATH = "/models/llama-3-8b"
VLLM_MODEL_CLAIM = "llama-3-8b"
#: vLLM's 503 past --max-num-queued-reqs (its QueueOverflowError): a refusal, as wok's 429
VLLM_BUSY = "cannot accept new requests"


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
    from wok_operator.plan import warm_start

    slos = Slos(s.slo_ttft_s, s.slo_tpot_s, s.slo_e2e_s)
    return warm_start(load_profile(s.profile), requests, slos)


def request_specs(s: Settings, requests: list[TraceRequest]) -> list[TraceRequest]:
    """What the client sends: lengths clipped as the simulator and the runtime clip them."""
    from wok_contracts.profile import load_profile
    from wok_contracts.traces import clip_to_model

    return clip_to_model(requests, load_profile(s.profile).max_model_len)[0]
