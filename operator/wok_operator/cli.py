"""Operator-side commands of the `wok` CLI: `crds`, `budget` (and `operator run`)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any


def register(commands: Any) -> None:
    register_operator(commands)
    crds = commands.add_parser("crds", help="print the InferenceService CRD (generated)")
    crds.set_defaults(func=run_crds)

    budget = commands.add_parser(
        "budget", help="the per-pod memory map and the max batch size by memory"
    )
    source = budget.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", help="a known architecture (see --list)")
    source.add_argument("--config", type=Path, help="an HF config.json")
    source.add_argument("--list", action="store_true", help="list the presets")
    budget.add_argument(
        "--gpu-memory",
        default="80Gi",
        metavar="QUANTITY",
        help="memory of one GPU, with its unit: 80Gi (GiB) or 80G (GB)",
    )
    budget.add_argument(
        "--gpus", type=int, default=1, help="GPUs per pod (tensor parallelism over them)"
    )
    budget.add_argument(
        "--utilization", type=float, default=0.9, help="share of the GPU memory wok may use"
    )
    budget.add_argument(
        "--max-model-len", type=int, default=4096, metavar="TOKENS", help="longest sequence"
    )
    budget.add_argument(
        "--sequence-length",
        type=int,
        metavar="TOKENS",
        help="L for B_mem, at most --max-model-len (default: --max-model-len)",
    )
    budget.add_argument("--dtype", default="float16", help="float16, bfloat16 or float32")
    budget.add_argument(
        "--reserve", default="512Mi", metavar="QUANTITY", help="kept free (CUDA context, …)"
    )
    budget.add_argument("--max-num-batched-tokens", type=int, default=2048)
    budget.add_argument("--json", action="store_true", help="machine-readable output")
    budget.set_defaults(func=run_budget)


def register_operator(commands: Any) -> None:
    operator = commands.add_parser("operator", help="the Kubernetes operator")
    sub = operator.add_subparsers(dest="operator_command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the operator (Kopf) against the current kubeconfig")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch (repeatable)")
    run.add_argument("--prometheus-url", help="default Prometheus for services that name none")
    run.add_argument(
        "--standalone", action="store_true", help="no leader election (only one replica runs)"
    )
    run.add_argument("--lease-name", default="wok-operator", help="the Lease replicas elect on")
    run.add_argument("--lease-namespace", help="default: $POD_NAMESPACE, else the first -n")
    run.add_argument("--lease-duration", type=int, default=15, metavar="S")
    run.add_argument("--renew-deadline", type=int, default=10, metavar="S")
    run.add_argument("--retry-period", type=int, default=2, metavar="S")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness URL")
    run.add_argument("--metrics-port", type=int, default=9090, help="0 disables /metrics")
    run.add_argument("--metrics-host", default="0.0.0.0")
    run.add_argument(
        "--pod-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra label on runtime pods (repeatable)",
    )
    run.add_argument("--log-format", choices=("json", "plain", "full"), default="json")
    run.add_argument("--verbose", action="store_true")
    run.set_defaults(func=run_operator)


def run_operator(args: argparse.Namespace) -> int:
    import faulthandler

    import kopf
    from prometheus_client import start_http_server

    from wok_operator import handlers, metrics, startup  # noqa: F401 - registers the Kopf handlers
    from wok_operator.handlers import OperatorConfig

    labels = {}
    for item in args.pod_label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--pod-label wants KEY=VALUE, got {item!r}")
        labels[key] = value
    if not args.all_namespaces and not args.namespace:
        raise ValueError("say which namespaces to watch: --namespace NS (repeatable) or -A")
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    # A crash in native code (an abort at exit, a segfault) leaves every thread's stack in the
    # log instead of only an exit status.
    faulthandler.enable()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host)
    leadership = None if args.standalone else win_the_lease(args)
    metrics.LEADER.set(1)
    config = OperatorConfig(prometheus_url=args.prometheus_url, extra_pod_labels=labels)
    try:
        kopf.run(
            clusterwide=args.all_namespaces,
            namespaces=args.namespace,
            # The Lease, not Kopf's peering, decides who acts (see wok_operator.leader).
            standalone=True,
            liveness_endpoint=args.liveness or None,
            memo=kopf.Memo(config=config, leadership=leadership),
        )
    finally:
        if leadership is not None:
            leadership.stop()
    return 0


def win_the_lease(args: argparse.Namespace) -> Any:
    """Block until this replica holds the Lease; a standby answers liveness meanwhile."""
    import os
    import signal

    from wok_operator.leader import Candidate, LeaseTimes, StandbyProbe
    from wok_operator.startup import load_kube_config

    namespace = args.lease_namespace or os.environ.get("POD_NAMESPACE")
    namespace = namespace or (args.namespace[0] if args.namespace else "default")
    times = LeaseTimes(args.lease_duration, args.renew_deadline, args.retry_period)
    api = load_kube_config()
    candidate = Candidate(api, name=args.lease_name, namespace=namespace, times=times)
    probe = StandbyProbe(args.liveness, candidate) if args.liveness else None

    def stand_down(*_: Any) -> None:
        raise SystemExit(0)  # nothing to drain yet; Kopf installs its own handler when it starts

    signal.signal(signal.SIGTERM, stand_down)
    try:
        candidate.start()
        candidate.wait_until_leading()
    except BaseException:
        candidate.stop()
        raise
    finally:
        if probe is not None:
            probe.close()
    return candidate


def run_crds(args: argparse.Namespace) -> int:
    from wok_operator.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


def memory_bytes(flag: str, text: str) -> int:
    """A memory size given on the command line. A bare number is refused: as a Kubernetes
    quantity it would be bytes, and `--gpu-memory 80` surely did not mean 80 bytes."""
    from wok_operator.api import quantity_bytes

    # A number with no suffix (80, 8.5, 1e10); 80E is a unit (exabytes), 0 needs none.
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text.strip()) and float(text) != 0:
        raise ValueError(
            f"{flag} {text} has no unit: write {text.strip()}Gi (GiB, 2^30 bytes) or "
            f"{text.strip()}G (GB, 10^9 bytes)"
        )
    return quantity_bytes(text)


def run_budget(args: argparse.Namespace) -> int:
    from wok_operator import budget

    if args.list:
        for name, arch in budget.PRESETS.items():
            params = budget.parameter_count(arch) / 1e9
            print(f"{name:16} {params:7.2f}B params  {arch.num_hidden_layers} layers")
        return 0
    if args.preset:
        arch = budget.preset(args.preset)
    else:
        arch = budget.architecture_from_hf_config(args.config)
    if args.sequence_length is not None and args.sequence_length > args.max_model_len:
        raise ValueError(
            f"--sequence-length {args.sequence_length} is above --max-model-len "
            f"{args.max_model_len}: no sequence is longer than the model's context"
        )
    plan = budget.plan_memory(
        arch,
        gpu_memory_bytes=memory_bytes("--gpu-memory", args.gpu_memory),
        gpus=args.gpus,
        utilization=args.utilization,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        reserve_bytes=memory_bytes("--reserve", args.reserve),
        max_num_batched_tokens=args.max_num_batched_tokens,
        sequence_length=args.sequence_length,
    )
    if args.json:
        print(json.dumps(plan.as_json()))
        return 0
    gib = budget.gib
    rows = [
        ("usable", gib(plan.usable_bytes)),
        ("weights", gib(plan.weights_bytes)),
        ("activations", gib(plan.activation_bytes)),
        ("reserve", gib(plan.reserve_bytes)),
        ("KV cache", gib(plan.kv_budget_bytes)),
        ("KV per token", f"{plan.kv_bytes_per_token:,} B"),
        ("KV per sequence", gib(plan.kv_bytes_per_token * plan.sequence_length)),
        ("free at max batch", gib(plan.free_bytes)),
        ("max batch by memory", f"{plan.max_batch_size} × {plan.sequence_length} tokens"),
    ]
    for label, value in rows:
        print(f"{label:>20}  {value}")
    return 0
