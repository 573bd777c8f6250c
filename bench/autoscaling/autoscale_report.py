"""The cluster benchmark's report: the markdown table and the plots, from the results JSON
(bench/autoscaling/autoscale_cluster.py)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoscale_settings import (
    CONCURRENCY_TARGET,
    POLICIES,
    SCRAPE_INTERVAL,
    SIM_TWIN,
    Settings,
)

from wok_contracts.traces import TraceRequest
from wok_sim.baselines import WAITING_TARGET


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def sec(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


FIXED_BATCHES = (
    "Fixed batches: the simulator's best in hindsight for the policy's twin on this slice."
)
REFUSED = {False: "429s", True: "refusals (vLLM's 503 past `--max-num-queued-reqs`)"}
VLLM_BATCH = (
    "vLLM cannot change its batch cap live: every policy's pods run the same `--max-num-seqs` "
    "(B; the simulator's best in hindsight for `keda-waiting` on this slice), rendered by the "
    "operator from `batching.maxBatchSize` with `applyToEngine: never`; `wok`'s law moves the "
    "replicas and may count a smaller batch per pod (its TPOT rule), never a larger one. Queue "
    "bound: `--max-num-queued-reqs` B + 256 (`queue.maxLength`, the default); `wok`'s policy "
    "line above is the law on vLLM's series alone (the operator's round for `engine: vllm`)."
)
VLLM_SIM = (
    ", `--engine vllm --max-num-seqs B` (the simulator's vLLM pods: the batch cap fixed, and "
    "no queue bound, so no refusals there: a request waits until it runs)"
)


def _policy_lines(s: Settings, policies: Sequence[str], vllm: bool) -> list[str]:
    wok = "the replicas, on vLLM's series; the batch is the pods'" if vllm else "batch and replicas"
    lines = {
        "keda-waiting": "- `keda-waiting`: KEDA ScaledObject, Prometheus trigger "
        f"`sum(vllm:num_requests_waiting{{namespace=…}})`, threshold {WAITING_TARGET:g} "
        "(AverageValue), pollingInterval 30 s, `useCachedMetrics` (the simulator's KEDA "
        "model), HPA default behaviour, on the InferenceService's scale subresource "
        "(`scaling.replicas: external`), fixed batch.",
        "hpa-concurrency": "- `hpa-concurrency`: the same path, query `sum(running) + "
        f"sum(waiting)`, AverageValue target {CONCURRENCY_TARGET} per pod, read at every 15 s "
        "HPA sync; fixed batch.",
        "wok": f"- `wok`: the operator moves {wok} (defaults; podStartSeconds "
        f"{round(s.load_seconds)}).",
        "wok-batch+keda": "- `wok-batch+keda`: KEDA as in `keda-waiting` owns the replicas, wok "
        "moves the batch.",
    }
    return [lines[p] for p in policies]


def _pods(s: Settings, vllm: bool) -> str:
    if vllm:
        return (
            "an `engine: vllm` InferenceService: the operator's vLLM pods, rendered and scraped "
            "as for real vLLM, run by the cluster as fake vLLM pods (no GPU here): wok's runtime "
            f"on the simulated accelerator `{s.profile}` answering as vLLM 0.32 (only vLLM's "
            "metric series, `/health`, a 503 past `--max-num-queued-reqs`, the batch fixed at "
            f"`--max-num-seqs`; cluster/wok_cluster/vllm_sim.py), {s.load_seconds:g} s load"
        )
    return (
        f"an InferenceService on `{s.profile}` pods (the real runtime on the simulated "
        f"accelerator, {s.load_seconds:g} s load)"
    )


def write_markdown(data: dict[str, Any]) -> str:
    """autoscale_cluster.md from the results JSON: the set-up, the cluster's table, the simulator
    beside it, the runs, the notes."""
    s = Settings(**data["settings"])
    runs: dict[str, dict] = data.get("runs", {})
    sims: dict[str, dict] = data.get("simulator", {})
    ordered = [p for p in POLICIES if p in runs]
    vllm = data.get("engine") == "vllm"
    lines = [
        *set_up(data, s, vllm),
        *cluster_table(runs, ordered, vllm),
        *beside_the_simulator(runs, sims, ordered, s, vllm),
        *runs_table(runs, ordered),
    ]
    notes = data.get("notes", [])
    if notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def set_up(data: dict[str, Any], s: Settings, vllm: bool) -> list[str]:
    """The title, the commands, the set-up and the policies."""
    ordered = [p for p in POLICIES if p in data.get("runs", {})]
    return [
        "# wok against KEDA on `engine: vllm` pods on the emulated cluster"
        if vllm
        else "# wok against KEDA and the HPA on the emulated cluster",
        "",
        "Made by `bench/autoscaling/autoscale_cluster.py`; every invocation merges its runs into "
        f"`autoscale_cluster{'_vllm' if vllm else ''}.json` and rewrites this file and the plot "
        "from all runs present. Commands:",
        "",
        *(f"- `{c}`" for c in data.get("commands", [])),
        "",
        f"**Set-up.** The first {s.minutes:g} min of the shared Azure code trace, "
        f"{s.rate_mode} ×{s.rate_scale:g} (seed {s.seed}), replayed with its clock against "
        f"{_pods(s, vllm)}, on the emulated cluster (real kube-apiserver, "
        "kube-controller-manager with its HPA controller, KEDA v2 from upstream, Prometheus "
        f"scraping every {SCRAPE_INTERVAL}). SLOs: TTFT {s.slo_ttft_s:g} s, mean TPOT "
        f"{s.slo_tpot_s:g} s, E2E {s.slo_e2e_s:g} s, on the client, from each request's "
        f"scheduled arrival; {REFUSED[vllm]}, timeouts and failures miss all three. Every run "
        "starts from "
        "the same ready fleet, the simulator's warm start for the slice; at most "
        f"{s.max_replicas} replicas. Requests go to the ready pod with the fewest in flight "
        "(the simulator's `least-loaded`); a refused connection or a 503 `draining`/`loading` "
        "is retried on a pod not tried yet, at most three attempts. Pod-hours count every pod "
        "from creation to deletion, pending and terminating included, within the trace's span "
        "(as the simulator bills; "
        "with the tail until the last answer in the JSON).",
        "",
        *_policy_lines(s, ordered if vllm else POLICIES, vllm),
        "",
        VLLM_BATCH if vllm else FIXED_BATCHES,
        "",
    ]


def cluster_table(runs: dict[str, dict], ordered: list[str], vllm: bool) -> list[str]:
    """Each policy's outcome on the cluster."""
    lines = [
        "## On the cluster",
        "",
        "| policy | all SLOs | TTFT | TPOT | E2E | P99 TTFT s | P99 TPOT s | P99 E2E s | pod-h |"
        f" scale events | flips | {'refused' if vllm else '429'} | timeouts | failed | max R | B |",
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
    return lines


def beside_the_simulator(
    runs: dict[str, dict], sims: dict[str, dict], ordered: list[str], s: Settings, vllm: bool
) -> list[str]:
    """Each policy against its twin in `wok simulate` on the same slice, and the twins alone."""
    lines = [
        "",
        "## Beside the simulator",
        "",
        "`wok simulate` on the same slice (written to a CSV in the trace's format), same rate "
        f"scale, mode, seed, SLOs, profile, warm start and max replicas, `--cold-start "
        f"{s.load_seconds:g} --routing least-loaded --scrape-interval 5 --duration "
        f"{s.horizon_s:g}`{VLLM_SIM if vllm else ''}. Target: within 3 points of attainment and "
        "10 % of pod-hours.",
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
    return lines


def runs_table(runs: dict[str, dict], ordered: list[str]) -> list[str]:
    """How each run went: its wall time, the machine's load, what ran beside it."""
    lines = [
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
    return lines


def plot(data: dict[str, Any], specs: list[TraceRequest] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data.get("runs", {})
    fig, (ax_l, ax_r, ax_b) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    if specs:
        minutes = Counter(int(sp.arrival_s // 60) for sp in specs)
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
