"""How close the law is to a fleet that knows the future: a heuristic reference, not a bound.

A clairvoyant fleet reads the trace ahead: at every 15 s tick it asks for the pods that the busiest
minute of GPU work within the next pod start + one minute needs at utilization u (a request's work
is its prefill plus its decode steps at the profile's costs, the step's fixed cost shared by a
batch of B). It starts from the autoscalers' shared warm start, its pods take the same pod start,
and it runs on the same simulator; only its knowledge of arrivals is impossible. Swept over u and B,
it draws the attainment a given GPU budget can buy with this one foresight heuristic. It is a
reference, not a bound: a better use of the same foresight (or of none: `wok evaluate`'s static
frontier) may do better, so a law may pass it and a goal beyond it is not proven out of reach.

    .venv/bin/python bench/autoscaling/clairvoyant.py            # about 8 min on 2 cores
    .venv/bin/python bench/autoscaling/clairvoyant.py --render  # the tables again

Writes bench/autoscaling/results/clairvoyant.md and .json.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from autoscale_sim import HELD_OUT, PROFILE, SHARED_TRACE, held_out_scale

from wok_contracts.profile import StepProfile, load_profile
from wok_contracts.slos import Slos
from wok_contracts.traces import TraceRequest, clip_to_model, load_trace, scale_rate
from wok_operator.plan import batch_mem_of, warm_start
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.policy import Action, FleetView
from wok_sim.report import summarize

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
POD_START_S = 90.0
UTILIZATIONS = (0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
BATCHES = (16, 64, 256)
TICK_S = 15.0
PEAK_WINDOW_S = 60.0


class ClairvoyantPolicy:
    """Pods for the busiest minute of work ahead within one pod start, from the trace itself."""

    interval_s = TICK_S

    def __init__(
        self,
        requests: list[TraceRequest],
        profile: StepProfile,
        *,
        batch: int,
        u: float,
        start: int,
    ) -> None:
        self.name = "clairvoyant"
        self.fixed_batch: int | None = batch
        self.u = u
        self.start_replicas = start
        p = profile
        clipped, _ = clip_to_model(requests, p.max_model_len)

        def work(r: TraceRequest) -> float:
            context = r.prompt_tokens + r.output_tokens / 2
            per_token = p.b_s_per_seq + p.a_s / batch + p.d_s_per_context_token * context
            return p.c_s_per_prefill_token * r.prompt_tokens + r.output_tokens * per_token

        pairs = sorted((r.arrival_s, work(r)) for r in clipped)
        self.arrivals = [t for t, _ in pairs]
        self.cumulative = [0.0, *itertools.accumulate(w for _, w in pairs)]

    def start(self) -> Action:
        return Action(batch=self.fixed_batch or 1, replicas=self.start_replicas)

    def decide(self, view: FleetView) -> Action:
        busiest = 0.0
        for offset in range(0, int(POD_START_S + PEAK_WINDOW_S + TICK_S), int(TICK_S)):
            begin = view.now + offset
            i = bisect.bisect_left(self.arrivals, begin)
            j = bisect.bisect_left(self.arrivals, begin + PEAK_WINDOW_S)
            busiest = max(busiest, (self.cumulative[j] - self.cumulative[i]) / PEAK_WINDOW_S)
        return Action(batch=self.fixed_batch or 1, replicas=max(1, math.ceil(busiest / self.u)))


def loads() -> dict[str, tuple[list[TraceRequest], float, Slos]]:
    """The shared trace and the held-out ones, scaled as bench/autoscaling/autoscale_sim.py scales
    them."""
    out = {"shared Azure code trace, x3 overlay": (SHARED_TRACE, 3.0, Slos(2.0, 0.1, 5.0))}
    for title, path in HELD_OUT.items():
        if path.exists():
            scale = held_out_scale(path)
            out[f"{title}, x{scale:g} overlay"] = (path, scale, Slos(2.0, 0.1, None))
    return {
        title: (scale_rate(load_trace(str(path)), scale, mode="overlay", seed=0), scale, slos)
        for title, (path, scale, slos) in out.items()
    }


def run_one(title: str, batch: int, u: float) -> dict:
    requests, _, slos = LOADS[title]
    profile = load_profile(PROFILE)
    start = warm_start(profile, requests, slos)
    policy = ClairvoyantPolicy(requests, profile, batch=batch, u=u, start=start)
    config = FleetConfig(profile=profile, cold_start_s=POD_START_S, seed=0)
    result = summarize("clairvoyant", simulate_fleet(list(requests), policy, config), slos)
    return {
        "load": title,
        "batch": batch,
        "u": u,
        "slo_attainment": result.slo_attainment,
        "gpu_hours": result.gpu_hours,
        "flips": result.flips,
    }


LOADS = loads()


def main() -> int:
    out = RESULTS
    if "--render" in sys.argv[1:]:
        render(json.loads((out / "clairvoyant.json").read_text()))
        return 0
    profile = load_profile(PROFILE)
    jobs = [
        (title, b, u)
        for title, (requests, _, _) in LOADS.items()
        for b in BATCHES
        if b <= batch_mem_of(profile, requests)
        for u in UTILIZATIONS
    ]
    with ProcessPoolExecutor(max_workers=2) as pool:
        runs = []
        for n, run in enumerate(pool.map(run_one, *zip(*jobs, strict=True)), 1):
            runs.append(run)
            print(f"[{n}/{len(jobs)}] {run}", file=sys.stderr, flush=True)
    (out / "clairvoyant.json").write_text(json.dumps(runs, indent=2) + "\n")
    render(runs)
    return 0


def render(runs: list[dict]) -> None:
    """clairvoyant.md from the runs, beside wok's and static-peak's rows of autoscale_sim.json."""
    out = RESULTS
    sim = out / "autoscale_sim.json"
    measured = json.loads(sim.read_text()) if sim.exists() else {}
    parts = [
        "# A fleet that knows the future (a heuristic reference, not a bound)",
        "",
        "Made by `.venv/bin/python bench/autoscaling/clairvoyant.py`: "
        f"profile `{PROFILE}`, {POD_START_S:g} s "
        "pod start, the autoscalers' warm start, random routing; per u, the best fixed B in "
        "hindsight of "
        f"{', '.join(map(str, BATCHES))} (≤ B_mem). `wok` and `static-peak` are the same load's "
        "rows in bench/autoscaling/results/autoscale_sim.md, 90 s pod start.",
    ]
    for title in dict.fromkeys(r["load"] for r in runs):
        rows = [r for r in runs if r["load"] == title]
        parts += ["", f"## {title}", "", "| u | all SLOs | GPU-h | B |", "|---|---|---|---|"]
        for u in UTILIZATIONS:
            best = max(
                (r for r in rows if r["u"] == u),
                key=lambda r: (r["slo_attainment"], -r["gpu_hours"]),
            )
            parts.append(
                f"| {u:g} | {best['slo_attainment']:.2%} | {best['gpu_hours']:.2f} | "
                f"{best['batch']} |"
            )
        table = next((t for k, t in measured.items() if _same_load(k, title)), None)
        for name in ("wok", "static-peak"):
            if table and name in table:
                r = table[name]
                parts.append(
                    f"| {name} | {r['slo_attainment']:.2%} | {r['gpu_hours']:.2f} | "
                    f"{r['batch_size'] or '-'} |"
                )
    (out / "clairvoyant.md").write_text("\n".join(parts) + "\n")
    print(f"wrote {out / 'clairvoyant.md'}", file=sys.stderr)


def _same_load(key: str, title: str) -> bool:
    """The autoscale_sim table of this load at a 90 s pod start."""
    if not key.endswith("90 s pod start"):
        return False
    if title.startswith("shared"):
        return key.startswith("overlay,")
    return key.startswith(title)


if __name__ == "__main__":
    sys.exit(main())
