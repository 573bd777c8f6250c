"""NVIDIA Dynamo's SLA planner, aggregated form, as pure code for the `dynamo-planner` policy.

A port of ai-dynamo/dynamo `components/src/dynamo/planner/`:

- `core/load/predictors.py` (260b6ae9412cea46626b25b11407fbebd30e5cb0): the constant, ARIMA
  (pmdarima's auto_arima, refit once then updated, with the log1p fallback when the raw fit
  collapses to (0,d,0)) and Prophet predictors, with their idle-skip (leading zeros are not
  recorded) and non-finite → 0 rules. ARIMA and Prophet need the `field` extra;
- `core/perf_model/agg.py` (518a70279da932774915f3b039b6978f9b1057f8)
  `AggRegressionModel.find_best_engine_agg_rps` and `estimate_next_ttft`: the batch-size sweep
  for the most requests/s one aggregated engine serves within the TTFT and ITL targets;
- `core/throughput_scaling.py` (0c9050c9145373a09157ded5f64e6784abb1dc3b) `_throughput_agg`:
  replicas = max(ceil(demand / engine rps), min_endpoint), within the GPU budget.

Dynamo fits the iteration wall time `f(prefill tokens, decode KV tokens)` from its engines'
forward-pass metrics (or a profiling sweep); here it is wok's step profile, the model `wok
simulate` runs, `a + b·decodes + c·prefill_tokens + d·context_tokens`, with the sweep's batch as
the decode count.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

from wok_contracts.profile import StepCosts

ADJUSTMENT_INTERVAL_S = 180.0  # BasePlannerDefaults.throughput_adjustment_interval
MIN_ENDPOINT = 1
MAX_GPU_BUDGET = 8  # BasePlannerDefaults.max_gpu_budget (one GPU per engine here)
PROPHET_WINDOW_SIZE = 50
KV_CAP_FALLBACK = 1024  # the sweep's cap when the engine's KV capacity is unknown


class FieldExtraMissing(RuntimeError):
    """A predictor needs a package of the `field` extra that is not installed."""


def _require(module: str, predictor: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise FieldExtraMissing(
            f"the {predictor} load predictor needs {module.split('.')[0]}: "
            "pip install 'wok[field]' (the constant predictor needs nothing)"
        ) from error


class Predictor(Protocol):
    def add_data_point(self, value: float) -> None: ...

    def predict_next(self) -> float: ...


class ConstantPredictor:
    """The next interval's load is the last one's."""

    minimum_data_points = 1

    def __init__(self) -> None:
        self.data_buffer: list[float] = []
        self._seen_nonzero = False

    def _admit(self, value: float) -> float | None:
        """`BasePredictor.add_data_point`'s rules: non-finite is 0; leading zeros are skipped."""
        if not math.isfinite(value):
            value = 0.0
        if value == 0 and not self._seen_nonzero:
            return None
        if value != 0:
            self._seen_nonzero = True
        return value

    def add_data_point(self, value: float) -> None:
        admitted = self._admit(value)
        if admitted is not None:
            self.data_buffer.append(admitted)

    def get_last_value(self) -> float:
        return self.data_buffer[-1] if self.data_buffer else 0.0

    def predict_next(self) -> float:
        return self.get_last_value()


class ArimaPredictor(ConstantPredictor):
    """pmdarima's auto_arima, fitted once on the first 5 points, then updated point by point."""

    minimum_data_points = 5

    def __init__(self, *, log1p: bool = False) -> None:
        super().__init__()
        self.pmdarima = _require("pmdarima", "ARIMA")
        self.requested_log1p = log1p
        self.log1p = log1p
        self.raw: list[float] = []
        self.pending: list[float] = []
        self.model: Any = None

    def add_data_point(self, value: float) -> None:
        admitted = self._admit(value)
        if admitted is None:
            return
        raw = max(0.0, admitted)
        self.raw.append(raw)
        self.pending.append(raw)
        self.data_buffer.append(math.log1p(raw) if self.log1p else raw)

    def get_last_value(self) -> float:
        return self.raw[-1] if self.raw else 0.0

    def _fit(self, series: list[float]) -> Any:
        return self.pmdarima.auto_arima(series, suppress_warnings=True, error_action="ignore")

    def predict_next(self) -> float:
        if len(self.raw) < self.minimum_data_points:
            return self.get_last_value()
        if len(set(self.raw)) == 1:  # auto_arima predicts 0 on a constant series
            return self.raw[0]
        try:
            if self.model is None:
                self.log1p = self.requested_log1p
                if self.log1p:
                    self.data_buffer = [math.log1p(v) for v in self.raw]
                self.model = self._fit(self.data_buffer)
                p, _, q = getattr(self.model, "order", (1, 0, 1))
                if p == 0 and q == 0 and not self.requested_log1p:
                    # A raw fit collapsed to (0,d,0): refit on log1p(y), for spiky series.
                    log_buffer = [math.log1p(v) for v in self.raw]
                    self.model, self.log1p, self.data_buffer = (
                        self._fit(log_buffer),
                        True,
                        log_buffer,
                    )
            elif self.pending:
                self.model.update(
                    [math.log1p(v) for v in self.pending] if self.log1p else self.pending
                )
            self.pending = []
            forecast = float(self.model.predict(n_periods=1)[0])
            return max(0.0, math.expm1(forecast)) if self.log1p else max(0.0, forecast)
        except Exception:  # upstream falls back to the last value on any fitting failure
            self.pending = []
            return self.get_last_value()


class ProphetPredictor(ConstantPredictor):
    """Meta's Prophet, refitted each interval on the last `window_size` points, one point per
    adjustment interval from a fixed base date."""

    minimum_data_points = 5
    start_date = datetime(2024, 1, 1)

    def __init__(
        self,
        *,
        step_size_s: float = ADJUSTMENT_INTERVAL_S,
        window_size: int = PROPHET_WINDOW_SIZE,
        log1p: bool = False,
    ) -> None:
        super().__init__()
        self.pandas = _require("pandas", "Prophet")
        self.prophet = _require("prophet", "Prophet")
        for chatty in ("prophet", "cmdstanpy"):  # upstream quiets them too
            logging.getLogger(chatty).setLevel(logging.WARNING)
        self.step_size_s = step_size_s
        self.window_size = window_size
        self.log1p = log1p
        self.curr_step = 0
        self.points: list[dict[str, Any]] = []

    def _timestamp(self, step: int) -> datetime:
        return self.start_date + timedelta(seconds=step * self.step_size_s)

    def add_data_point(self, value: float) -> None:
        admitted = self._admit(value)
        if admitted is None:
            return
        y = math.log1p(max(0.0, admitted)) if self.log1p else admitted
        self.points = [*self.points, {"ds": self._timestamp(self.curr_step), "y": y}]
        self.points = self.points[-self.window_size :]
        self.curr_step += 1

    def get_last_value(self) -> float:
        if not self.points:
            return 0.0
        y = float(self.points[-1]["y"])
        return max(0.0, math.expm1(y)) if self.log1p else y

    def predict_next(self) -> float:
        if len(self.points) < self.minimum_data_points:
            return self.get_last_value()
        model = self.prophet.Prophet()
        model.fit(self.pandas.DataFrame(self.points))
        future = self.pandas.DataFrame({"ds": [self._timestamp(self.curr_step)]})
        yhat = float(model.predict(future)["yhat"].iloc[0])
        return max(0.0, math.expm1(yhat)) if self.log1p else max(0.0, yhat)


LOAD_PREDICTORS: dict[str, Callable[[], Predictor]] = {
    "constant": ConstantPredictor,
    "arima": ArimaPredictor,
    "prophet": ProphetPredictor,
}


def make_predictor(name: str) -> Predictor:
    if name not in LOAD_PREDICTORS:
        raise ValueError(f"unknown load predictor {name!r} (known: {', '.join(LOAD_PREDICTORS)})")
    return LOAD_PREDICTORS[name]()


WallTime = Callable[[float, float, int], float]  # (prefill tokens, decode KV tokens, decodes) → s


def profile_wall_time(costs: StepCosts) -> WallTime:
    """The iteration time Dynamo regresses, from wok's step profile."""

    def wall_time(prefill_tokens: float, decode_kv_tokens: float, decodes: int) -> float:
        return max(1e-6, costs.step_seconds(decodes, prefill_tokens, decode_kv_tokens))

    return wall_time


def estimate_next_ttft(
    wall_time: WallTime,
    *,
    queued_prefill_tokens: float,
    avg_isl: float,
    max_num_batched_tokens: int,
    current_decode_kv: float,
    decodes: int,
) -> float:
    """`AggRegressionModel.estimate_next_ttft`: the queue plus one request's prompt, chunked by the
    step budget, each chunk beside the current decode load."""
    total = queued_prefill_tokens + avg_isl
    if total <= 0:
        return 0.0
    elapsed, remaining = 0.0, total
    for _ in range(math.ceil(total / max_num_batched_tokens)):
        chunk = min(remaining, max_num_batched_tokens)
        elapsed += wall_time(chunk, current_decode_kv, decodes)
        remaining -= chunk
    return elapsed


def find_best_engine_agg_rps(
    wall_time: WallTime,
    *,
    isl: float,
    osl: float,
    max_num_batched_tokens: int,
    ttft_sla_ms: float,
    itl_sla_ms: float,
    max_kv_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> tuple[float, float, float]:
    """The most requests/s one aggregated engine serves within both targets, with its TTFT and
    ITL (ms): the largest batch whose iteration meets the ITL and whose next request meets the
    TTFT, by Little's law rps = batch / (osl × iteration). (0, 0, 0) on empty inputs. The next
    request's prompt in the TTFT estimate is `isl` (upstream: its engines' running mean ISL)."""
    if isl <= 0 or osl <= 0 or max_num_batched_tokens <= 0:
        return (0.0, 0.0, 0.0)
    avg_ctx = isl + osl / 2.0
    kv_cap = max(1, int(max_kv_tokens / max(1.0, avg_ctx))) if max_kv_tokens else KV_CAP_FALLBACK
    seq_cap = max_num_seqs if max_num_seqs and max_num_seqs > 0 else kv_cap
    hard_cap = min(kv_cap, seq_cap, max_num_batched_tokens - 1)

    def prefill_balanced(x: int) -> bool:
        budget = max_num_batched_tokens - x
        return budget > 0 and isl / budget <= osl

    lo, hi = 1, max(1, hard_cap)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if prefill_balanced(mid) else (lo, mid - 1)
    best = (0.0, 0.0, 0.0)
    for bs in range(1, lo + 1):
        decode_kv = bs * avg_ctx
        prefill_per_iter = min(bs * isl / max(1.0, osl), max_num_batched_tokens)
        wt = wall_time(prefill_per_iter, decode_kv, bs)
        itl_ms = wt * 1000.0
        ttft_ms = 1000.0 * estimate_next_ttft(
            wall_time,
            queued_prefill_tokens=int(prefill_per_iter),
            avg_isl=isl,
            max_num_batched_tokens=max_num_batched_tokens,
            current_decode_kv=int(decode_kv),
            decodes=bs,
        )
        if itl_ms > itl_sla_ms or ttft_ms > ttft_sla_ms:
            if bs == 1:  # even one at a time misses: upstream still reports its rate
                best = (1.0 / (osl * wt), ttft_ms, itl_ms)
            break
        best = (bs / (osl * wt), ttft_ms, itl_ms)
    return best


def agg_replicas(
    demand_rps: float,
    engine_rps: float,
    *,
    min_endpoint: int = MIN_ENDPOINT,
    max_replicas: int = MAX_GPU_BUDGET,
) -> int | None:
    """`_throughput_agg`'s count: None when the perf model gave no rate (no scaling)."""
    if engine_rps <= 0:
        return None
    desired = max(math.ceil(demand_rps / engine_rps), min_endpoint)
    return min(desired, max_replicas)  # _apply_single_budget at one GPU per engine
