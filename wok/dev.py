"""`wok dev up|down|status|kubeconfig|build|operator` (and `wok dev backer`, which `up` runs
detached).

Heavy imports stay inside the handlers so `wok --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any


def register(commands: Any) -> None:
    dev = commands.add_parser("dev", help="a local emulated Kubernetes cluster with GPU nodes")
    sub = dev.add_subparsers(dest="dev_command", required=True, metavar="ACTION")

    up = sub.add_parser("up", help="start etcd, apiserver, controllers, KWOK nodes, Prometheus")
    up.add_argument("--nodes", type=int, default=2, help="emulated GPU nodes (default 2)")
    up.add_argument("--gpus-per-node", type=int, default=8, help="nvidia.com/gpu per node")
    up.add_argument(
        "--keda",
        action="store_true",
        help="also KEDA's operator and metrics adapter (external.metrics.k8s.io)",
    )
    up.set_defaults(func=_up)
    sub.add_parser("down", help="stop everything `up` started").set_defaults(func=_down)
    sub.add_parser("status", help="what is running").set_defaults(func=_status)
    sub.add_parser("kubeconfig", help="print the admin kubeconfig path").set_defaults(
        func=_kubeconfig
    )
    sub.add_parser("build", help="build the pinned control-plane binaries").set_defaults(
        func=_build
    )
    operator = sub.add_parser(
        "operator",
        help="run `wok operator run` against this cluster with the flags it needs "
        "(flags after -- are passed on)",
    )
    operator.add_argument("-n", "--namespace", default="default", help="watch (default: default)")
    operator.add_argument("operator_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    operator.set_defaults(func=_operator)
    backer = sub.add_parser("backer", help="run the pod backer in the foreground (used by up)")
    backer.add_argument("--kubeconfig", required=True)
    backer.add_argument("--state-dir", required=True)
    backer.add_argument(
        "--vllm-sim-profile",
        default=None,
        help="run vLLM containers as fake vLLM pods: wok's runtime on this simulated "
        "accelerator, answering as vLLM (wok_cluster/vllm_sim.py)",
    )
    backer.set_defaults(func=_backer)


def _up(args: argparse.Namespace) -> int:
    from wok_cluster.devenv import DevEnvironment

    try:
        state = DevEnvironment().up(
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, keda=args.keda
        )
    except RuntimeError as error:
        print(f"wok dev up: {error}", file=sys.stderr)
        return 1
    seconds = state["seconds"]
    print(
        f"# cluster up in {seconds['cluster_ready']}s (apiserver {seconds['apiserver_ready']}s); "
        f"nodes {', '.join(state['nodes'])}; Prometheus {state['prometheus']}",
        file=sys.stderr,
    )
    if state["keda"]:
        print(
            f"# KEDA {state['keda']['version']}: adapter on {state['keda']['address']}",
            file=sys.stderr,
        )
    print(f"export KUBECONFIG={state['kubeconfig']}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from wok_cluster.devenv import DevEnvironment

    stopped = DevEnvironment().down()
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from wok_cluster.devenv import DevEnvironment

    status = DevEnvironment().status()
    print(json.dumps(status, indent=2))
    return 0 if status["up"] else 1


def _kubeconfig(args: argparse.Namespace) -> int:
    from wok_cluster.devenv import DevEnvironment

    state = DevEnvironment().load()
    if state is None:
        print("wok dev kubeconfig: not up (run `wok dev up`)", file=sys.stderr)
        return 1
    print(state["kubeconfig"])
    return 0


def _operator(args: argparse.Namespace) -> int:
    from wok_cluster.devenv import DevEnvironment, operator_argv
    from wok_cluster.netutil import free_port
    from wok_operator import cli as operator_cli

    state = DevEnvironment().load()
    if state is None:
        print("wok dev operator: not up (run `wok dev up`)", file=sys.stderr)
        return 1
    extra = [a for a in args.operator_args if a != "--"]
    argv = operator_argv(state, namespace=args.namespace, liveness_port=free_port(), extra=extra)
    print(f"# KUBECONFIG={state['kubeconfig']} {shlex.join(['wok', *argv])}", file=sys.stderr)
    os.environ["KUBECONFIG"] = state["kubeconfig"]
    # `wok operator run` parsed by the operator's own parser (not wok.cli's, which imports this
    # module): the same flags and defaults, and no import cycle.
    parser = argparse.ArgumentParser(prog="wok")
    operator_cli.register_operator(parser.add_subparsers(dest="command", required=True))
    operator_args = parser.parse_args(argv)
    return int(operator_args.func(operator_args) or 0)


def _build(args: argparse.Namespace) -> int:
    from wok_cluster import binaries

    binaries.build()
    print(binaries.bin_dir())
    return 0


def _backer(args: argparse.Namespace) -> int:
    from wok_cluster.backer import main

    return main(args)
