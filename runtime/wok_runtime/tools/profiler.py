"""`wok profile`: what one engine step costs on this device, as a `wok_sim` step-time profile.

Why: the fleet simulator, `wok plan` and the simulated accelerator all predict a step as
`a + b·decodes + c·prefill_tokens + d·context_tokens` (`wok_contracts.profile.StepProfile`). The
coefficients are only worth what their measurement is, so this module runs the real model runner
and the engine's sampler on a grid of step shapes, times each shape (a warm-up pass, then the
median over several passes through the whole grid in random orders, synchronised on CUDA), and
fits the four costs by non-negative least squares.

A grid point is `decodes` running sequences of mean context `context` (spread evenly over
[context/2, 3·context/2], as the lengths of a live batch are) plus one prefill chunk of `prefill`
prompt tokens from position 0. `context_tokens` is Σ over the step's inputs of the keys each one
attends to (a decode at length n reads n; a chunk [s, s+p) reads s+p). Each input gets its own KV
blocks of the engine's real pool, so KV reads stream from memory as in a full batch.

On a CPU with one torch thread a step is timed by its thread's CPU time (`--clock auto`): the
other processes of a shared machine then stretch it far less than wall time (they still share its
caches and memory bandwidth, so the profile records the load average and each shape's spread).

The fit weighs each point by 1/t: decode steps (milliseconds) matter to TPOT as much as prefill
steps (seconds) do to TTFT, and plain least squares would fit only the slow ones. NNLS over four
unknowns is solved exactly by trying every support that contains `a` (at most eight small systems).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wok_contracts.profile import StepCosts, StepProfile

if TYPE_CHECKING:  # torch stays out of `wok --help`
    from wok_runtime.core.engine import LLMEngine
    from wok_runtime.core.model_runner import ModelRunner, StepInput

DEFAULT_DECODES = (0, 1, 4, 16, 64)
DEFAULT_CONTEXTS = (128, 512, 1024, 2048)
DEFAULT_PREFILLS = (0, 64, 256, 1024)
QUICK_DECODES, QUICK_CONTEXTS, QUICK_PREFILLS = (1, 8), (64, 256), (0, 64)
MIN_SECONDS, MAX_REPEATS = 0.25, 25  # per shape: repeat a fast step up to this long


@dataclass(frozen=True)
class StepShape:
    """One grid point: `decodes` sequences of mean length `context`, one chunk of `prefill`."""

    decodes: int
    context: int
    prefill: int


@dataclass(frozen=True)
class StepSample:
    """A timed step shape: the model's three regressors and the measured seconds."""

    decodes: int
    prefill_tokens: int
    context_tokens: int
    seconds: float  # median over the timed passes
    spread: float = 0.0  # (max - min) / median over the timed passes: the machine's noise
    repeats: int = 1  # timed passes
    context: int = 0  # the grid's mean decode length, for the record


@dataclass(frozen=True)
class StepFit(StepCosts):
    a_s: float
    b_s_per_seq: float
    c_s_per_prefill_token: float
    d_s_per_context_token: float
    r2: float  # on seconds, unweighted
    median_abs_rel_error: float
    max_abs_rel_error: float


# --- the fit (pure Python) ----------------------------------------------------------------------


def fit_step_costs(samples: Sequence[StepSample]) -> StepFit:
    """Non-negative least squares of seconds on (1, decodes, prefill, context), minimising the
    relative error Σ((prediction − t) / t)², with a > 0."""
    if len(samples) < 2:
        raise ValueError(f"a fit needs at least 2 timed step shapes, got {len(samples)}")
    if min(s.seconds for s in samples) <= 0:
        raise ValueError("every timed step must take a positive time")
    # Weighted rows: each regressor and the target divided by the measured time.
    rows = [
        [x / s.seconds for x in (1.0, s.decodes, s.prefill_tokens, s.context_tokens)]
        for s in samples
    ]
    best: tuple[float, list[float]] | None = None
    for size in range(1, 5):
        for rest in combinations(range(1, 4), size - 1):
            support = (0, *rest)
            coefs = _least_squares([[row[j] for j in support] for row in rows], [1.0] * len(rows))
            if coefs is None or coefs[0] <= 0 or min(coefs) < 0:
                continue
            full = [0.0] * 4
            for j, value in zip(support, coefs, strict=True):
                full[j] = value
            loss = sum(
                (sum(x * c for x, c in zip(row, full, strict=True)) - 1.0) ** 2 for row in rows
            )
            if best is None or loss < best[0]:
                best = (loss, full)
    if best is None:
        raise ValueError("no non-negative fit with a positive fixed cost exists for these timings")
    a, b, c, d = best[1]
    fit = StepFit(a, b, c, d, r2=0.0, median_abs_rel_error=0.0, max_abs_rel_error=0.0)
    predicted = [fit.step_seconds(s.decodes, s.prefill_tokens, s.context_tokens) for s in samples]
    seconds = [s.seconds for s in samples]
    mean = statistics.fmean(seconds)
    total = sum((t - mean) ** 2 for t in seconds)
    residual = sum((p - t) ** 2 for p, t in zip(predicted, seconds, strict=True))
    errors = [abs(p - t) / t for p, t in zip(predicted, seconds, strict=True)]
    return StepFit(
        a,
        b,
        c,
        d,
        r2=1.0 - residual / total if total > 0 else 1.0,
        median_abs_rel_error=statistics.median(errors),
        max_abs_rel_error=max(errors),
    )


def _least_squares(rows: list[list[float]], target: list[float]) -> list[float] | None:
    """argmin ‖X·β − y‖ through the normal equations, columns scaled to unit norm first (the
    regressors span six orders of magnitude). None when the columns are linearly dependent."""
    k = len(rows[0])
    norms = [math.sqrt(sum(row[j] ** 2 for row in rows)) for j in range(k)]
    if min(norms) == 0:
        return None
    x = [[row[j] / norms[j] for j in range(k)] for row in rows]
    gram = [[sum(r[i] * r[j] for r in x) for j in range(k)] for i in range(k)]
    rhs = [sum(r[i] * y for r, y in zip(x, target, strict=True)) for i in range(k)]
    solution = _solve(gram, rhs)
    return None if solution is None else [v / n for v, n in zip(solution, norms, strict=True)]


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a (numerically) singular matrix."""
    n = len(rhs)
    m = [[*row, value] for row, value in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= factor * m[col][c]
    out = [0.0] * n
    for r in reversed(range(n)):
        out[r] = (m[r][n] - sum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
    return out


# --- the grid -----------------------------------------------------------------------------------


def decode_lengths(shape: StepShape, max_model_len: int) -> list[int]:
    """The decodes' context lengths: evenly over [context/2, 3·context/2], within the model."""
    d, mean = shape.decodes, shape.context
    return [max(1, min(max_model_len, round(mean * (0.5 + (i + 0.5) / d)))) for i in range(d)]


def blocks_needed(shape: StepShape, *, block_size: int, max_model_len: int) -> int:
    lengths = [*decode_lengths(shape, max_model_len), shape.prefill]
    return sum(-(-n // block_size) for n in lengths)


def grid_shapes(
    decodes: Sequence[int],
    contexts: Sequence[int],
    prefills: Sequence[int],
    *,
    max_model_len: int,
    token_budget: int,
    kv_blocks: int,
    block_size: int,
) -> tuple[list[StepShape], list[StepShape]]:
    """(shapes to time, shapes left out because the step budget or the KV pool cannot hold
    them). With no decodes the context is moot, so those shapes appear once."""
    keep: list[StepShape] = []
    skipped: list[StepShape] = []
    seen: set[StepShape] = set()
    for d in sorted(set(decodes)):
        for ctx in sorted(set(contexts)):
            for p in sorted(set(prefills)):
                shape = StepShape(decodes=d, context=ctx if d else 0, prefill=p)
                if shape in seen or d + p == 0 or p > max_model_len:
                    continue
                seen.add(shape)
                fits = d + p <= token_budget and kv_blocks >= blocks_needed(
                    shape, block_size=block_size, max_model_len=max_model_len
                )
                (keep if fits else skipped).append(shape)
    return keep, skipped


def step_inputs(shape: StepShape, *, block_size: int, max_model_len: int) -> list[StepInput]:
    """The runner's inputs for `shape`, each on its own consecutive blocks from block 0."""
    from wok_runtime.core.model_runner import StepInput

    inputs: list[StepInput] = []
    next_block = 0

    def table(tokens: int) -> list[int]:
        nonlocal next_block
        n = -(-tokens // block_size)
        next_block += n
        return list(range(next_block - n, next_block))

    for n in decode_lengths(shape, max_model_len):
        inputs.append(StepInput(token_ids=[1], start_pos=n - 1, block_table=table(n)))
    if shape.prefill:
        ids = [1 + i % 255 for i in range(shape.prefill)]
        inputs.append(StepInput(token_ids=ids, start_pos=0, block_table=table(shape.prefill)))
    return inputs


def context_tokens(inputs: Sequence[StepInput]) -> int:
    return sum(x.start_pos + len(x.token_ids) for x in inputs)


# --- measurement --------------------------------------------------------------------------------


def time_step(
    engine: LLMEngine,
    inputs: list[StepInput],
    *,
    warmup: int,
    repeats: int,
    min_seconds: float = MIN_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of the model part of an engine step (the runner's forward, then the engine's
    sampler over every row, as when each input reaches its last token): at least `repeats`
    times, more for a fast step (up to `min_seconds` of timing or MAX_REPEATS)."""
    from wok_runtime.core.sampler import Sampler
    from wok_runtime.core.sampling_params import SamplingParams

    params = SamplingParams(ignore_eos=True)  # what `wok bench engine` requests use
    requests = [(str(i), params) for i in range(len(inputs))]
    sampler = Sampler()
    sync = _synchronizer(engine)
    times: list[float] = []
    for i in range(warmup + max(repeats, MAX_REPEATS)):
        started = clock()
        logits = engine.runner.forward(inputs)
        sampler.sample(logits, requests)
        sync()
        if i >= warmup:
            times.append(clock() - started)
        # Fast shapes repeat until they fill `min_seconds`: their median is the noisiest.
        if len(times) >= repeats and sum(times) >= min_seconds:
            break
    return times


def _synchronizer(engine: LLMEngine) -> Callable[[], None]:
    import torch

    device = engine.runner.device
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def measure(
    engine: LLMEngine,
    shapes: list[StepShape],
    *,
    warmup: int,
    repeats: int,
    seed: int = 0,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> list[StepSample]:
    """Times every shape in `warmup` untimed passes, then `repeats` timed passes over the whole
    grid, each in a fresh seeded random order: a drift of the machine's load over the minutes of a
    run then touches every shape alike instead of the ones timed last. In a timed pass a fast
    shape runs several times in a row (`MIN_SECONDS / repeats`) and counts by its median."""
    from tqdm import tqdm

    runner = engine.runner
    inputs = {
        shape: step_inputs(shape, block_size=runner.block_size, max_model_len=engine.max_model_len)
        for shape in shapes
    }
    passes: dict[StepShape, list[float]] = {shape: [] for shape in shapes}
    rng = random.Random(seed)
    bar = tqdm(
        total=(warmup + repeats) * len(shapes),
        desc="step shapes",
        unit="step",
        file=sys.stderr,
        disable=not progress,
    )
    with bar:
        for number in range(warmup + repeats):
            order = list(shapes)
            rng.shuffle(order)
            for shape in order:
                if number < warmup:
                    time_step(engine, inputs[shape], warmup=0, repeats=1, min_seconds=0)
                else:
                    times = time_step(
                        engine,
                        inputs[shape],
                        warmup=0,
                        repeats=1,
                        min_seconds=MIN_SECONDS / repeats,
                        clock=clock,
                    )
                    passes[shape].append(statistics.median(times))
                bar.update(1)
    samples = []
    for shape in shapes:
        times = passes[shape]
        median = statistics.median(times)
        samples.append(
            StepSample(
                decodes=shape.decodes,
                prefill_tokens=shape.prefill,
                context_tokens=context_tokens(inputs[shape]),
                seconds=median,
                spread=(max(times) - min(times)) / median,
                repeats=len(times),
                context=shape.context,
            )
        )
    return sorted(samples, key=lambda s: (s.decodes, s.context, s.prefill_tokens))


def pick_clock(choice: str, *, device_type: str, threads: int) -> tuple[Callable[[], float], str]:
    """The clock that times a step, and its name for the record. `auto` is the thread's CPU time
    on a one-thread CPU (a shared machine's other processes then only slow the step down in
    wall time, which is not the device's cost) and wall time otherwise."""
    if choice == "auto":
        choice = "cpu" if device_type == "cpu" and threads == 1 else "wall"
    if choice == "cpu":
        if device_type != "cpu" or threads != 1:
            raise ValueError("--clock cpu needs --device cpu and --threads 1 (a thread's CPU time)")
        return time.thread_time, "cpu: the timing thread's CPU time (time.thread_time)"
    return time.perf_counter, "wall (time.perf_counter, after torch.cuda.synchronize on CUDA)"


def device_label(device_type: str) -> str:
    """`cpu: <model name>` from /proc/cpuinfo, or the CUDA device's name."""
    if device_type == "cuda":
        import torch

        return f"cuda: {torch.cuda.get_device_name()}"
    import platform

    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    return f"cpu: {name}"


# --- the command --------------------------------------------------------------------------------


def parse_ints(text: str, flag: str) -> tuple[int, ...]:
    """`0,1,4,16` -> (0, 1, 4, 16); every value >= 0."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise ValueError(f"{flag} expects integers >= 0, got {text!r}")
    return values


def register_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="builtin:tiny", help="model source (builtin:NAME or a dir)")
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.add_argument("--name", default=None, help="profile name (default: MODEL-DEVICE)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=None,
        help="KV pool (default on CPU: the largest decode batch × max_model_len; on CUDA: sized "
        "from free memory as the runtime does)",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="step token budget")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--decodes", default=None, help="running sequences per step, e.g. 0,1,4,16,64")
    p.add_argument("--contexts", default=None, help="mean decode context lengths, e.g. 128,512")
    p.add_argument("--prefill", default=None, help="prefill chunk sizes, e.g. 0,64,256,1024")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's; on a shared CPU 1 avoids OpenMP threads that "
        "spin-wait for each other)",
    )
    p.add_argument(
        "--clock",
        choices=("auto", "wall", "cpu"),
        default="auto",
        help="what times a step (auto: the thread's CPU time with --threads 1 on CPU, else wall)",
    )
    p.add_argument(
        "--cuda-graph-max-batch",
        type=int,
        default=0,
        help="CUDA: decode steps up to this batch replayed from captured graphs, as "
        "`wok runtime serve --cuda-graphs` runs them (0: none)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed passes over the grid first")
    p.add_argument("--repeats", type=int, default=5, help="timed passes over the whole grid")
    p.add_argument("--quick", action="store_true", help="a tiny grid, 2 repeats (for tests)")
    p.add_argument("--seed", type=int, default=0, help="order in which the shapes are timed")
    p.add_argument("--no-progress", action="store_true")
    http = p.add_argument_group(
        "over HTTP (http_profiler.py): time a running OpenAI server, e.g. vLLM, from its stream"
    )
    http.add_argument(
        "--url", default=None, help="the server (loopback), e.g. http://127.0.0.1:8000"
    )
    http.add_argument(
        "--kv-capacity-tokens", type=int, default=None, help="default: the server's /metrics"
    )
    http.add_argument(
        "--step-token-budget",
        dest="max_num_batched_tokens_http",
        type=int,
        default=None,
        help="the server's max_num_batched_tokens (default: its /metrics where it says it)",
    )
    http.add_argument(
        "--load-seconds", type=float, default=60.0, help="start-up time to record (not measured)"
    )
    http.add_argument(
        "--device-label", default=None, help="what the server runs on, for the record"
    )


def run_from_args(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.url:
        from wok_runtime.tools.http_profiler import profile_over_http

        profile = profile_over_http(args)
    else:
        profile = profile_from_args(args)
    Path(args.out).write_text(profile.to_json())
    fit = profile.fit
    print(
        f"{profile.name}: a={profile.a_s * 1e3:.3f} ms  b={profile.b_s_per_seq * 1e3:.4f} ms/seq  "
        f"c={profile.c_s_per_prefill_token * 1e3:.4f} ms/token  "
        f"d={profile.d_s_per_context_token * 1e6:.4f} µs/context token\n"
        f"R²={fit['r2']:.4f}  |rel err| median {fit['median_abs_rel_error']:.1%} "
        f"max {fit['max_abs_rel_error']:.1%}  over {len(fit['grid'])} shapes  "
        f"KV {profile.kv_capacity_tokens} tokens  load {profile.load_seconds:.2f} s  "
        f"took {time.monotonic() - started:.0f} s -> {args.out}"
    )
    return 0


Grid = tuple[int, ...]


def grid_flags(args: argparse.Namespace) -> tuple[Grid | None, Grid | None, Grid | None]:
    """The --decodes, --contexts and --prefill grids as given (None for a flag not given)."""
    decodes = parse_ints(args.decodes, "--decodes") if args.decodes else None
    contexts = parse_ints(args.contexts, "--contexts") if args.contexts else None
    prefills = parse_ints(args.prefill, "--prefill") if args.prefill else None
    return decodes, contexts, prefills


def requested_grid(args: argparse.Namespace) -> tuple[Grid, Grid, Grid]:
    """(decodes, contexts, prefills) to time: each flag's, else the --quick grid's, else the
    default's."""
    decodes, contexts, prefills = grid_flags(args)
    if args.quick:
        decodes = decodes or QUICK_DECODES
        contexts, prefills = contexts or QUICK_CONTEXTS, prefills or QUICK_PREFILLS
    decodes, contexts = decodes or DEFAULT_DECODES, contexts or DEFAULT_CONTEXTS
    return decodes, contexts, prefills or DEFAULT_PREFILLS


def timed_passes(args: argparse.Namespace) -> int:
    """The passes over the grid (2 with --quick), once --repeats and --warmup are checked."""
    repeats = 2 if args.quick else args.repeats
    if repeats < 1 or args.warmup < 0:
        raise ValueError("--repeats must be >= 1 and --warmup >= 0")
    return repeats


@dataclass(frozen=True)
class EngineChoice:
    """What the profiled engine runs with: the flags', else the model's and the device's."""

    device: str
    dtype: str
    max_model_len: int
    kv_cache_bytes: int | None  # None: sized from free memory (CUDA)


def engine_choice(args: argparse.Namespace, *, max_decodes: int) -> EngineChoice:
    """The device, dtype, context length and KV pool; a built-in model is generated here,
    outside the timing. On CPU the pool holds the largest decode batch at full length."""
    from wok_runtime.core.loader import resolve_source
    from wok_runtime.core.model_config import ModelConfig
    from wok_runtime.http.serve import _default_dtype
    from wok_runtime.tools.bench_engine import default_kv_cache_bytes

    path = resolve_source(args.model)
    model_max = ModelConfig.from_file(path / "config.json").max_position_embeddings
    max_model_len = args.max_model_len or model_max
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    dtype = args.dtype or _default_dtype(device)
    kv_bytes = args.kv_cache_bytes
    if kv_bytes is None and device == "cpu":
        kv_bytes = default_kv_cache_bytes(
            args.model, dtype=dtype, max_batch_size=max_decodes, max_model_len=max_model_len
        )
    return EngineChoice(device, dtype, max_model_len, kv_bytes)


def load_engine(
    args: argparse.Namespace, choice: EngineChoice
) -> tuple[ModelRunner, LLMEngine, float]:
    """The runner and engine, and their load time: until their first step has run."""
    from wok_runtime.core.engine import EngineConfig, LLMEngine
    from wok_runtime.core.model_runner import ModelRunner

    max_model_len = choice.max_model_len
    load_started = time.perf_counter()
    runner = ModelRunner.from_source(
        args.model,
        dtype=choice.dtype,
        device=choice.device,
        block_size=args.block_size,
        kv_cache_bytes=choice.kv_cache_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        cuda_graph_max_batch=args.cuda_graph_max_batch,
    )
    engine = LLMEngine(
        runner,
        EngineConfig(
            max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=max_model_len
        ),
    )
    first = StepShape(decodes=0, context=0, prefill=min(16, max_model_len))
    inputs = step_inputs(first, block_size=runner.block_size, max_model_len=max_model_len)
    time_step(engine, inputs, warmup=0, repeats=1, min_seconds=0)  # ready = the first step has run
    return runner, engine, time.perf_counter() - load_started


def measure_and_fit(
    args: argparse.Namespace,
    engine: LLMEngine,
    shapes: list[StepShape],
    *,
    skipped: Sequence[StepShape],
    repeats: int,
    dtype: str,
    device_type: str,
) -> tuple[StepFit, dict[str, Any]]:
    """Every shape timed (--warmup, then `repeats` passes in random orders), the four costs fitted,
    and the fit's record with the clock and the machine's load around the measurement."""
    clock, clock_name = pick_clock(args.clock, device_type=device_type, threads=_torch_threads())
    measure_started = time.monotonic()
    load_before = os.getloadavg()[0]  # what else ran on the machine, for the record
    samples = measure(
        engine,
        shapes,
        warmup=args.warmup,
        repeats=repeats,
        seed=args.seed,
        progress=not args.no_progress,
        clock=clock,
    )
    fit = fit_step_costs(samples)
    record = fit_record(
        samples,
        fit,
        skipped=skipped,
        warmup=args.warmup,
        repeats=repeats,
        measure_seconds=time.monotonic() - measure_started,
        settings={
            "clock": clock_name,
            "dtype": dtype,
            "torch_threads": _torch_threads(),
            "load_average_1m": [load_before, os.getloadavg()[0]],
            "command": _command(),
        },
    )
    return fit, record


def profile_from_args(args: argparse.Namespace) -> StepProfile:
    decodes, contexts, prefills = requested_grid(args)
    repeats = timed_passes(args)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError("--threads must be >= 1")
        _set_torch_threads(args.threads)
    choice = engine_choice(args, max_decodes=max(decodes))
    max_model_len = choice.max_model_len
    contexts = tuple(c for c in contexts if c <= max_model_len) or (max_model_len,)
    runner, engine, load_seconds = load_engine(args, choice)
    shapes, skipped = grid_shapes(
        decodes,
        contexts,
        prefills,
        max_model_len=max_model_len,
        token_budget=engine.max_num_batched_tokens,
        kv_blocks=runner.num_blocks,
        block_size=runner.block_size,
    )
    if len(shapes) < 4:
        raise ValueError(f"the grid leaves {len(shapes)} step shapes that fit; 4 are needed")
    fit, record = measure_and_fit(
        args,
        engine,
        shapes,
        skipped=skipped,
        repeats=repeats,
        dtype=choice.dtype,
        device_type=runner.device.type,
    )
    device_name = device_label(runner.device.type)
    model_name = args.model.removeprefix("builtin:").rstrip("/").rsplit("/", 1)[-1]
    return StepProfile(
        name=args.name or f"{model_name}-{runner.device.type}",
        kind="measured",
        device=device_name,
        a_s=fit.a_s,
        b_s_per_seq=fit.b_s_per_seq,
        c_s_per_prefill_token=fit.c_s_per_prefill_token,
        d_s_per_context_token=fit.d_s_per_context_token,
        step_token_budget=engine.max_num_batched_tokens,
        kv_capacity_tokens=engine.block_manager.num_blocks * engine.block_manager.block_size,
        block_size=runner.block_size,
        max_model_len=max_model_len,
        load_seconds=round(load_seconds, 3),
        notes=_notes(args.model, device_name, fit, record),
        fit=record,
    )


def fit_record(
    samples: Sequence[StepSample],
    fit: StepFit,
    *,
    skipped: Sequence[StepShape],
    warmup: int,
    repeats: int,
    measure_seconds: float,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The profile's `fit`: how it was measured, how well the model explains it, and the grid."""
    spreads = [s.spread for s in samples]
    return {
        "method": "non-negative least squares weighted by 1/t (relative error), a > 0",
        "context_tokens": "sum over the step's inputs of the keys each attends to",
        "r2": round(fit.r2, 5),
        "median_abs_rel_error": round(fit.median_abs_rel_error, 4),
        "max_abs_rel_error": round(fit.max_abs_rel_error, 4),
        "warmup": warmup,
        "passes": repeats,
        "min_seconds_per_shape": MIN_SECONDS,  # over all passes; fast steps run more than once
        "median_spread": round(statistics.median(spreads), 4),
        "max_spread": round(max(spreads), 4),
        "measure_seconds": round(measure_seconds, 1),
        **settings,
        "skipped": [[s.decodes, s.context, s.prefill] for s in skipped],
        "grid": [
            {
                "decodes": s.decodes,
                "context": s.context,
                "prefill_tokens": s.prefill_tokens,
                "context_tokens": s.context_tokens,
                "seconds": round(s.seconds, 6),
                "predicted": round(
                    fit.step_seconds(s.decodes, s.prefill_tokens, s.context_tokens), 6
                ),
                "spread": round(s.spread, 4),
                "passes": s.repeats,
            }
            for s in samples
        ],
    }


def _notes(model: str, device: str, fit: StepFit, record: dict[str, Any]) -> str:
    load = record["load_average_1m"]
    return (
        f"Measured by `wok profile` on {model} ({record['dtype']}, {device}, "
        f"{record['torch_threads']} torch thread(s)): the runner's forward and the engine's "
        f"sampler, per step shape, timed by {record['clock']}, median over passes. The "
        "scheduler's own Python per step is not in it. The machine is shared and noisy (1-minute "
        f"load average {load[0]:.1f} before, {load[1]:.1f} after, on {os.cpu_count()} CPUs): "
        "each shape's spread over the passes is in fit.grid (median "
        f"{record['median_spread']:.0%}). Fit: R² {fit.r2:.4f}, median |relative error| "
        f"{fit.median_abs_rel_error:.1%}, max {fit.max_abs_rel_error:.1%}."
    )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _command() -> str:
    """The command line, for the record (from Python, e.g. a test, only its name)."""
    import shlex

    return "wok " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["profile"] else "wok profile"
