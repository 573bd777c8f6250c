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

    .venv/bin/python bench/autoscaling/autoscale_cluster.py --minutes 20 \
        --policy keda-waiting,hpa-concurrency
    .venv/bin/python bench/autoscaling/autoscale_cluster.py --minutes 20 --policy wok
    .venv/bin/python bench/autoscaling/autoscale_cluster.py --minutes 20 --sim-only  # no cluster
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from autoscale_manifests import model_volume, scaled_object, service_spec
from autoscale_replay import Fleet, replay, summarize
from autoscale_report import plot, write_markdown
from autoscale_settings import (
    CRD,
    EXTERNAL,
    FIXED_BATCH,
    NAME,
    POLICIES,
    RESULTS,
    ROOT,
    SCRAPE_INTERVAL,
    SIM_TWIN,
    Settings,
    request_specs,
    slice_requests,
    start_replicas,
    write_slice,
)

from wok_cluster.apiserver import ControlPlane
from wok_cluster.binaries import BUILT, KEDA, Binaries, bin_dir, kubectl, missing
from wok_cluster.cluster import Cluster
from wok_cluster.keda import Keda
from wok_cluster.kubeapi import KubeApi, KubeError
from wok_cluster.netutil import free_port
from wok_cluster.prometheus import Prometheus
from wok_cluster.waiting import GiveUp, wait_until
from wok_contracts.profile import load_profile
from wok_contracts.traces import TraceRequest

# --- the simulator beside the cluster ----------------------------------------------------------


def simulate(
    s: Settings, slice_csv: Path, twins: list[str], *, vllm_max_num_seqs: int | None = None
) -> tuple[dict[str, Any], list[str]]:
    """`wok simulate --json` for the twins (on vLLM pods at `vllm_max_num_seqs`, if given);
    returns their results and the command."""
    vllm = (
        []
        if vllm_max_num_seqs is None
        else ["--engine=vllm", f"--max-num-seqs={vllm_max_num_seqs}"]
    )
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
        *vllm,
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
        if vllm_max_num_seqs is not None:  # the pods' cap, whatever B a fixed policy swept
            result["batch_size"] = vllm_max_num_seqs
    return out, command


def best_fixed_batch(s: Settings, slice_csv: Path) -> int:
    """The vLLM pods' --max-num-seqs: the simulator's best in hindsight for keda-waiting (the
    fixed-batch policy) on this slice, as the wok-engine runs choose theirs."""
    sims, _ = simulate(s, slice_csv, ["keda-waiting"])
    return int(sims["keda-waiting"]["batch_size"])


# --- the cluster run ---------------------------------------------------------------------------


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
    specs: list[TraceRequest],
    initial: int,
    fixed_batch: int | None,
    run_dir: Path,
    engine: str,
) -> dict[str, Any]:
    started_wall = time.monotonic()
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    namespace = f"bench-{policy.replace('+', '-')}"
    kc = plane.kubeconfig
    so_path = f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects/{NAME}"
    with plane.api() as api:
        api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        if engine == "vllm":
            pv, pvc = model_volume(namespace)
            api.create("/api/v1/persistentvolumes", pv)
            api.create(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc)
        operator = Operator(kc, namespace, prometheus.url, run_dir / f"operator-{namespace}.log")
        try:
            apply_service(
                kc, namespace, service_spec(policy, s, initial, fixed_batch, engine=engine)
            )
            decisions = run_dir / f"decisions-{namespace}.jsonl"
            fleet = Fleet(api, namespace, s.horizon_s, decisions=decisions)
            print(f"[{policy}] waiting for {initial} ready pods", file=sys.stderr, flush=True)

            def fleet_ready() -> bool:
                if operator.popen.poll() is not None:
                    raise GiveUp(f"the operator exited ({operator.popen.returncode})")
                fleet.list_pods()
                return len(fleet.ready) >= initial

            wait_until(
                fleet_ready, timeout=s.load_seconds + 240, what="the initial fleet", interval=1.0
            )
            ready_s = time.monotonic() - started_wall
            hand_over(api, policy, namespace, prometheus.url, s)
            print(
                f"[{policy}] fleet ready after {ready_s:.0f} s; replaying {len(specs)} requests"
                f" over {s.minutes:g} min",
                file=sys.stderr,
                flush=True,
            )
            results, replay_s = asyncio.run(replay(fleet, specs, s.seed, policy))
            summary = summarize(results, fleet, s)
            if policy in EXTERNAL:
                summary |= hpa_summary(api, namespace)
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


def hpa_path(namespace: str) -> str:
    """The HPA that KEDA makes for the ScaledObject."""
    return f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/keda-hpa-{NAME}"


def apply_service(kubeconfig: Path, namespace: str, spec: dict[str, Any]) -> None:
    """The run's InferenceService, applied as a user would."""
    doc = {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME},
        "spec": spec,
    }
    applied = kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(doc))
    if applied.returncode != 0:
        raise RuntimeError(f"kubectl apply: {applied.stderr}")


def hand_over(api: KubeApi, policy: str, namespace: str, prometheus_url: str, s: Settings) -> None:
    """Once the initial fleet is ready, the replicas go to the policy: wok's floor drops to one
    pod; an external policy gets its ScaledObject, and the run waits for KEDA's HPA."""
    if policy == "wok":
        # The same start for every policy; from here on the law may go down to one pod.
        path = f"/apis/wok.dev/v1alpha1/namespaces/{namespace}/inferenceservices/{NAME}"
        api.patch(path, {"spec": {"scaling": {"minReplicas": 1}}})
    if policy in EXTERNAL:
        api.create(
            f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects",
            scaled_object(policy, namespace, prometheus_url, s),
        )
        wait_until(
            lambda: api.get(hpa_path(namespace)), timeout=60, what="KEDA's HPA", interval=1.0
        )


def hpa_summary(api: KubeApi, namespace: str) -> dict[str, Any]:
    """What the HPA did (its rescale events) and how it ended (its conditions)."""
    rescales = hpa_events(api, namespace)
    hpa = api.get(hpa_path(namespace))
    return {
        "hpa_rescales": rescales,
        "hpa_conditions": [
            f"{c['type']}={c['status']} {c.get('reason', '')}"
            for c in hpa.get("status", {}).get("conditions", [])
        ],
    }


# --- main --------------------------------------------------------------------------------------


def load_results(path: Path, s: Settings, engine: str) -> dict[str, Any]:
    if not path.exists():
        return {
            "settings": asdict(s),
            "engine": engine,
            "runs": {},
            "simulator": {},
            "commands": [],
        }
    data = json.loads(path.read_text())
    if data.get("settings") != asdict(s) or data.get("engine", "wok") != engine:
        raise SystemExit(
            f"{path} holds runs with other settings ({data.get('settings')}); pass the same "
            "settings, another --out, or --replace to start it over"
        )
    return data


def main(argv: list[str] | None = None) -> int:
    args, policies = parse_args(argv)
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
    vllm = args.engine == "vllm"
    if vllm and load_profile(settings.profile).load_seconds != settings.load_seconds:
        raise SystemExit(
            f"--engine vllm: the fake vLLM pods load for {settings.profile}'s load_seconds"
        )
    data = load_results(json_path, settings, args.engine)
    command = "python bench/autoscaling/autoscale_cluster.py " + " ".join(
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
    # vLLM pods run one --max-num-seqs, every policy's
    pods_batch = None
    if vllm and not args.rewrite:
        pods_batch = args.fixed_batch or best_fixed_batch(settings, slice_csv)
    if twins:
        simulate_twins(settings, slice_csv, twins, data, pods_batch)
    if not args.sim_only:
        runs = run_on_cluster(args, policies, settings, specs, initial, data, run_dir, pods_batch)
        for policy, result in runs.items():
            result["command"] = command
            result["parallel_with"] = [x for x in runs if x != policy] if args.parallel else []
            data["runs"][policy] = result
    write_results(args, data, command, specs)
    return 0


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """The arguments, and the policies they name."""
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
    p.add_argument(
        "--engine",
        choices=("wok", "vllm"),
        default="wok",
        help="the pods' engine; vllm: an `engine: vllm` service whose pods the cluster runs as "
        "fake vLLM pods on the simulated accelerator (wok_cluster/vllm_sim.py), every policy at "
        "the same --max-num-seqs (--fixed-batch, else the simulator's best for keda-waiting)",
    )
    p.add_argument(
        "--out", type=Path, help="default: bench/autoscaling/results/autoscale_cluster[_vllm]"
    )
    args = p.parse_args(argv)
    if args.out is None:
        vllm = args.engine == "vllm"
        args.out = RESULTS / ("autoscale_cluster_vllm" if vllm else "autoscale_cluster")
    policies = POLICIES if args.policy == "all" else tuple(args.policy.split(","))
    unknown = [x for x in policies if x not in POLICIES]
    if unknown:
        p.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    return args, policies


def simulate_twins(
    settings: Settings,
    slice_csv: Path,
    twins: list[str],
    data: dict[str, Any],
    vllm_max_num_seqs: int | None = None,
) -> None:
    """The policies' twins in `wok simulate` on the same slice (on vLLM pods at
    `vllm_max_num_seqs`, if given), into the results."""
    print(f"simulating {', '.join(twins)}", file=sys.stderr, flush=True)
    sims, sim_command = simulate(settings, slice_csv, twins, vllm_max_num_seqs=vllm_max_num_seqs)
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


def fixed_batches(
    args: argparse.Namespace,
    policies: tuple[str, ...],
    data: dict[str, Any],
    pods_batch: int | None,
) -> dict[str, int | None]:
    """Each policy's fixed B (None: wok moves it): the vLLM pods' --max-num-seqs for every
    policy on vLLM; else --fixed-batch, or the simulator's best for the policy's twin."""
    if args.engine == "vllm":
        return dict.fromkeys(policies, pods_batch)
    return {
        x: (args.fixed_batch or data["simulator"][SIM_TWIN[x]]["batch_size"])
        if x in FIXED_BATCH
        else None
        for x in policies
    }


def run_on_cluster(
    args: argparse.Namespace,
    policies: tuple[str, ...],
    settings: Settings,
    specs: list[TraceRequest],
    initial: int,
    data: dict[str, Any],
    run_dir: Path,
    pods_batch: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Every policy's run on one emulated cluster (at once with --parallel), by policy; a
    policy that fails is left out, and said so. `pods_batch`: the vLLM pods' --max-num-seqs,
    every fixed-batch policy's B (the engine: vllm runs)."""
    vllm = args.engine == "vllm"
    needed = BUILT + KEDA if any(x in EXTERNAL for x in policies) else BUILT
    if missing(needed):
        raise SystemExit(f"{missing(needed)} not built in {bin_dir()}: run cluster/build.sh first")
    batches = fixed_batches(args, policies, data, pods_batch)
    nodes = math.ceil((len(policies) if args.parallel else 1) * args.max_replicas / 8)
    plane = ControlPlane(run_dir, Binaries(bin_dir()))
    cluster = Cluster(
        plane,
        nodes=max(2, nodes),
        gpus_per_node=8,
        vllm_sim_profile=settings.profile if vllm else None,
    )
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
                    args.engine,
                )
                short = {k: v for k, v in runs[policy].items() if k not in ("timeline", "settings")}
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
    if errors:
        print(f"failed: {errors}", file=sys.stderr)
    return runs


def write_results(
    args: argparse.Namespace, data: dict[str, Any], command: str, specs: list[TraceRequest]
) -> None:
    """The results JSON with this invocation's command and notes, the report and the plot."""
    data.setdefault("commands", [])
    if command not in data["commands"] and not args.rewrite:
        data["commands"].append(command)
    data.setdefault("notes", [])
    data["notes"] += [n for n in args.note if n not in data["notes"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path = args.out.with_suffix(".json")
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    markdown = write_markdown(data)
    args.out.with_suffix(".md").write_text(markdown)
    plot(data, specs, args.out.with_suffix(".png"))
    print(markdown)


if __name__ == "__main__":
    raise SystemExit(main())
