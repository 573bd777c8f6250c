"""llm-d's Workload Variant Autoscaler: its queueing-model capacity analysis of one variant.

A port of llm-d/llm-d-workload-variant-autoscaler at b08b1c77c89d284361e40b2a9315e93ef46e7022:

- `pkg/analyzer/mm1modelstatedependent.go`: a single queue with state-dependent service rates
  (n requests in service run at rate μ(n) = n / (prefill(n) + out × decode(n)) up to the max
  batch, the max batch's beyond), finite capacity max batch + max queue; with `queuemodel.go`'s
  `Solve` (its utilization check reads the *previous* solution's p₀, as upstream does);
- `pkg/analyzer/queueanalyzer.go`: `BuildModel`, `Analyze`, `Size` (a bisection per target for
  the largest rate whose mean TTFT and mean ITL meet it) and the iteration-time model
  T(n) = α + n·(β·(in+out)/(out+1) + γ·(in+out/2)) ms; `utils.go`'s `BinarySearch`;
- `pkg/core/allocation.go` `CreateAllocation`: max queue = 10 × max batch
  (`MaxQueueToBatchRatio`), the rate one replica sustains is the throughput at `Size`'s rate, and
  replicas = max(ceil(arrival rate / that rate), min replicas); no load: the min replicas.

Times are in milliseconds and rates in requests per millisecond inside the model, as upstream.
Upstream computes in float32; this port in float64 (upstream's tables pass either way).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

EPSILON = 0.001  # a small disturbance around a rate (queueanalyzer.go)
STABILITY_SAFETY_FRACTION = 0.1
MAX_QUEUE_TO_BATCH_RATIO = 10  # pkg/config/defaults.go
SEARCH_EPSILON = 1e-6  # utils.go epsilon
SEARCH_MAX_ITERATIONS = 100


class AnalyzerError(ValueError):
    """Upstream's `error` returns: invalid input, or a rate outside the model's stable range."""


@dataclass(frozen=True)
class ServiceParms:
    """Iteration time = α + n·(β·compute tokens + γ·memory tokens), in ms."""

    alpha: float
    beta: float
    gamma: float

    def iteration_time(self, size: RequestSize, batch: float) -> float:
        compute = (size.avg_input_tokens + size.avg_output_tokens) / (size.avg_output_tokens + 1)
        memory = size.avg_input_tokens + size.avg_output_tokens / 2
        return self.alpha + batch * (self.beta * compute + self.gamma * memory)

    def prefill_time(self, size: RequestSize, batch: float) -> float:
        if size.avg_input_tokens == 0:
            return 0.0
        return self.iteration_time(size, batch) + (self.beta + self.gamma) * size.avg_input_tokens

    def decode_time(self, size: RequestSize, batch: float) -> float:
        return (
            self.iteration_time(size, batch)
            + self.beta
            + self.gamma * (size.avg_input_tokens + size.avg_output_tokens / 2)
        )


@dataclass(frozen=True)
class RequestSize:
    avg_input_tokens: float
    avg_output_tokens: float

    def check(self) -> None:
        if self.avg_input_tokens < 0 or self.avg_output_tokens < 1:
            raise AnalyzerError(f"invalid request size {self}")


@dataclass(frozen=True)
class Configuration:
    max_batch_size: int
    max_queue_size: int
    service_parms: ServiceParms | None

    def check(self) -> None:
        if self.max_batch_size <= 0 or self.max_queue_size < 0 or self.service_parms is None:
            raise AnalyzerError(f"invalid configuration {self}")


@dataclass(frozen=True)
class TargetPerf:
    ttft_ms: float = 0.0  # 0: no target
    itl_ms: float = 0.0
    tps: float = 0.0

    def check(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0 or self.tps < 0:
            raise AnalyzerError(f"invalid target data values {self}")


@dataclass(frozen=True)
class AnalysisMetrics:
    throughput: float  # requests/s
    avg_resp_time: float  # ms
    avg_wait_time: float
    avg_num_in_serv: float
    avg_prefill_time: float
    avg_token_time: float
    avg_ttft: float
    max_rate: float  # requests/s
    rho: float


class StateDependentQueue:
    """`MM1ModelStateDependent`: the birth-death chain over 0..K requests in the system."""

    def __init__(self, capacity: int, serv_rate: Sequence[float]) -> None:
        self.K = capacity
        self.serv_rate = list(serv_rate)
        self.p = [0.0] * (capacity + 1)
        self.valid = False
        self.lam = 0.0
        self.rho = 0.0
        self.throughput = 0.0
        self.avg_num_in_servers = 0.0
        self.avg_num_in_system = 0.0
        self.avg_resp_time = 0.0
        self.avg_serv_time = 0.0
        self.avg_wait_time = 0.0

    def solve(self, lam: float, mu: float) -> None:
        self.lam = lam
        self.rho = 1 - self.p[0]  # ComputeRho, on the previous solution's p
        self.valid = not (self.rho < 0 or self.rho >= self.K or lam < 0 or mu <= 0)
        if self.valid:
            self._statistics()

    def _probabilities(self) -> None:
        p, num = self.p, len(self.serv_rate)
        scale = sys.float_info.max / self.K
        p[0] = 1.0
        for n in range(self.K):
            rate = self.serv_rate[n] if n < num else self.serv_rate[num - 1]
            p[n + 1] = p[n] * self.lam / rate
            while p[n + 1] < 0 or math.isinf(p[n + 1]) or math.isnan(p[n + 1]):
                for i in range(n + 1):
                    p[i] /= scale
                p[n + 1] = p[n] * self.lam / rate
        total = 0.0
        for n in range(self.K + 1):
            total += p[n]
            if total < 0 or math.isinf(total):
                total = 0.0
                for i in range(self.K + 1):
                    p[i] /= scale
                    if i <= n:
                        total += p[i]
        for n in range(self.K + 1):
            p[n] /= total
        self.rho = 1 - p[0]

    def _statistics(self) -> None:
        self._probabilities()
        num = len(self.serv_rate)
        in_servers = in_system = 0.0
        cumulative = self.p[0]
        for i in range(1, self.K + 1):
            in_system += i * self.p[i]
            cumulative += self.p[i]
            if i == num:
                in_servers = in_system + (1 - cumulative) * num
        self.avg_num_in_servers, self.avg_num_in_system = in_servers, in_system
        self.throughput = self.lam * (1 - self.p[self.K])
        self.avg_resp_time = in_system / self.throughput
        self.avg_serv_time = in_servers / self.throughput
        self.avg_wait_time = max(0.0, self.avg_resp_time - self.avg_serv_time)


def within_tolerance(x: float, value: float, tolerance: float) -> bool:
    if x == value:
        return True
    if value == 0 or tolerance < 0:
        return False
    return abs((x - value) / value) <= tolerance


def binary_search(
    x_min: float, x_max: float, y_target: float, evaluate: Callable[[float], float]
) -> tuple[float, int]:
    """`BinarySearch`: x with evaluate(x) ≈ y_target in [x_min, x_max], for a monotone evaluate;
    the indicator is −1 (target below the range: x_min), +1 (above: x_max) or 0."""
    if x_min > x_max:
        raise AnalyzerError(f"invalid range [{x_min}, {x_max}]")
    bounds = []
    for x in (x_min, x_max):
        y = evaluate(x)
        if within_tolerance(y, y_target, SEARCH_EPSILON):
            return x, 0
        bounds.append(y)
    increasing = bounds[0] < bounds[1]
    if (increasing and y_target < bounds[0]) or (not increasing and y_target > bounds[0]):
        return x_min, -1
    if (increasing and y_target > bounds[1]) or (not increasing and y_target < bounds[1]):
        return x_max, +1
    x_star = x_min
    for _ in range(SEARCH_MAX_ITERATIONS):
        x_star = 0.5 * (x_min + x_max)
        y_star = evaluate(x_star)
        if within_tolerance(y_star, y_target, SEARCH_EPSILON):
            break
        if (increasing and y_target < y_star) or (not increasing and y_target > y_star):
            x_max = x_star
        else:
            x_min = x_star
    return x_star, 0


class QueueAnalyzer:
    """`QueueAnalyzer` of one inference server (one replica of one variant)."""

    def __init__(self, config: Configuration, size: RequestSize) -> None:
        config.check()
        size.check()
        assert config.service_parms is not None
        self.config, self.size, self.parms = config, size, config.service_parms
        n_max = config.max_batch_size
        parms, out = self.parms, size.avg_output_tokens
        serv_rate = [
            n / (parms.prefill_time(size, n) + out * parms.decode_time(size, n))
            for n in range(1, n_max + 1)
        ]
        self.rate_min = serv_rate[0] * EPSILON * 1000  # requests/s
        self.rate_max = serv_rate[-1] * (1 - EPSILON) * 1000
        self.model = StateDependentQueue(config.max_queue_size + n_max, serv_rate)

    def _solve(self, lam_per_ms: float) -> StateDependentQueue:
        self.model.solve(lam_per_ms, 1.0)
        if not self.model.valid:
            raise AnalyzerError(f"invalid model at rate {lam_per_ms * 1000} requests/s")
        return self.model

    def _times(self, lam_per_ms: float) -> tuple[float, float, float]:
        """(prefill, per-token decode, TTFT) in ms at a rate, per `EvalTTFT` / `EvalITL`."""
        model = self._solve(lam_per_ms)
        prefill = self.parms.prefill_time(self.size, model.avg_num_in_servers)
        decode = (model.avg_serv_time - prefill) / self.size.avg_output_tokens
        return prefill, decode, model.avg_wait_time + prefill + decode

    def analyze(self, request_rate: float) -> AnalysisMetrics:
        if request_rate <= 0:
            raise AnalyzerError(f"invalid request rate {request_rate}")
        if request_rate > self.rate_max:
            raise AnalyzerError(f"rate={request_rate}, max allowed rate={self.rate_max}")
        prefill, decode, ttft = self._times(request_rate / 1000)
        model = self.model
        return AnalysisMetrics(
            throughput=model.throughput * 1000,
            avg_resp_time=model.avg_resp_time,
            avg_wait_time=model.avg_wait_time,
            avg_num_in_serv=model.avg_num_in_servers,
            avg_prefill_time=prefill,
            avg_token_time=decode,
            avg_ttft=ttft,
            max_rate=self.rate_max,
            rho=min(max(model.avg_num_in_servers / self.config.max_batch_size, 0.0), 1.0),
        )

    def size_for(self, target: TargetPerf) -> tuple[tuple[float, float, float], AnalysisMetrics]:
        """`Size`: the largest rates (requests/s) meeting each target, and the metrics at the
        smallest of them."""
        target.check()
        lam_min, lam_max = self.rate_min / 1000, self.rate_max / 1000
        rates = []
        for goal, pick in ((target.ttft_ms, 2), (target.itl_ms, 1)):
            if goal <= 0:
                rates.append(lam_max)
                continue
            lam, indicator = binary_search(
                lam_min, lam_max, goal, lambda lam, pick=pick: self._times(lam)[pick]
            )
            if indicator < 0:
                raise AnalyzerError(f"target {goal} ms is below the bounded region")
            rates.append(lam)
        rates.append(lam_max * (1 - STABILITY_SAFETY_FRACTION) if target.tps > 0 else lam_max)
        metrics = self.analyze(min(rates) * 1000)
        ttft_rate, itl_rate, tps_rate = (r * 1000 for r in rates)
        return (ttft_rate, itl_rate, tps_rate), metrics


def replicas_for(
    arrival_rate: float,
    size: RequestSize,
    *,
    parms: ServiceParms,
    max_batch: int,
    target: TargetPerf,
    min_replicas: int = 1,
) -> int | None:
    """`CreateAllocation`'s replica count for one variant; None where upstream finds no feasible
    allocation (the analyzer refuses the inputs or the targets)."""
    if arrival_rate == 0 or size.avg_output_tokens == 0:
        return min_replicas
    try:
        analyzer = QueueAnalyzer(
            Configuration(max_batch, max_batch * MAX_QUEUE_TO_BATCH_RATIO, parms), size
        )
        _, metrics = analyzer.size_for(target)
    except AnalyzerError:
        return None
    return max(math.ceil(arrival_rate / metrics.throughput), min_replicas)
