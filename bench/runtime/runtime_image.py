"""The runtime image's `--compile` against the venv's, side by side on this CPU.

Why: a pod runs the image, not the venv. Until the image carried a C++ toolchain, `--compile` in
a pod could build neither the CPU kernels nor inductor's step and fell back to eager; this checks
that the image's `--compile` now serves what the venv's does (goal: within 10 %), and what the
build costs at a pod's first start and what the node's compile cache saves at the second.

Both servers serve the same `builtin:` directory (bind-mounted read-only at the same path in the
container) with the same flags and one intra-op thread (runtime_vs_vllm.py's WOK_ENV); the
container runs as a pod does (podman with runc, read-only root, no capabilities, a 64 MiB /tmp as
the operator's emptyDir, the host's network so both are reached the same way), its cache
directory a host directory as the operator's `compileCacheHostPath` makes it. Each server runs
in a cpu cgroup of its own, as a pod does (see VENV_CGROUP). The same client
(bench_http.run_bench through runtime_vs_vllm.alternating_medians) drives both, alternating which
goes first each rep.

Start times: each side starts twice on an empty cache directory of its own (the first start
builds, the second loads what the first built), with `--log-level info` to read the runtime's
own compile time; then both start a third time for the loads.

    make image   # or: .venv/bin/python -m wok_cluster.images --no-archive
    .venv/bin/python bench/runtime/runtime_image.py  # writes bench/runtime/results/runtime_image.*
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))
from runtime_vs_vllm import (
    WOK_ENV,
    Load,
    Server,
    alternating_medians,
    loads,
    log,
    ratio,
    ratio_text,
    side_by_side_bars,
    wok_server,
)

from wok_cluster import images
from wok_runtime.core.builtin import ensure_builtin

RESULTS = Path(__file__).resolve().parent / "results"
LOADS = ("closed-1", "closed-8", "closed-32")
# a native build that failed: the server would serve eager, and this would measure the slow path
FELL_BACK = re.compile(r"could not be built|compiling the model failed")
COMPILED = re.compile(r"model compiled and warmed up in ([\d.]+) s")
RUNTIME_USER = 1000  # the image's USER
# cgroup v1's cpu controller, as on these machines. podman puts the container in a cpu cgroup
# of its own (libpod_parent/libpod-ID), and CFS weighs a group as one task against every process
# of the root group: on a machine shared with other work, a venv server left in the root group
# would get a larger share of the CPU than the container. So the venv server gets a group too.
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
VENV_CGROUP = CPU_CGROUP / "wok-bench-venv"


class TimedServer(Server):
    """A Server that remembers how long it took to turn ready."""

    ready_s: float | None = None

    def start(self, timeout_s: float) -> None:
        started = time.monotonic()
        super().start(timeout_s)
        self.ready_s = time.monotonic() - started


def in_cpu_cgroup(group: Path, command: list[str]) -> list[str]:
    """`command`, started inside the cpu cgroup `group` (made if missing)."""
    group.mkdir(exist_ok=True)
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *command]


def venv_server(model_dir: Path, logs: Path, cache: Path, extra: list[str]) -> TimedServer:
    base = wok_server(model_dir, logs, ["--compile", *extra])
    env = {**base.env, "WOK_CACHE_DIR": str(cache)}
    command = in_cpu_cgroup(VENV_CGROUP, base.command)
    return TimedServer("venv", command, env, base.ready_path, base.port, logs / "venv.log")


def image_server(
    image: str, model_dir: Path, logs: Path, cache: Path, extra: list[str]
) -> TimedServer:
    """The same `wok runtime serve` as `venv_server`, in the image, locked down as a pod is."""
    base = wok_server(model_dir, logs, ["--compile", *extra])
    name = f"wok-bench-image-{base.port}"
    argv = ["podman", "run", "--rm", f"--name={name}", "--network=host", "--read-only"]
    argv += ["--tmpfs=/tmp:rw,size=64m", "--cap-drop=ALL", "--security-opt=no-new-privileges"]
    argv += [f"--user={RUNTIME_USER}:{RUNTIME_USER}", f"--volume={cache}:/var/cache/wok"]
    argv += [f"--volume={model_dir}:{model_dir}:ro"]
    argv += [f"--env={key}={value}" for key, value in WOK_ENV.items()]
    argv += [image, *base.command[3:]]  # `runtime serve …`, after `python -m wok.cli`
    env = {"CONTAINERS_CONF": images.podman_env()["CONTAINERS_CONF"]}
    return TimedServer("image", argv, env, base.ready_path, base.port, logs / "image.log")


def cache_files(cache: Path) -> dict[str, int]:
    """Files under each of compile_cache's directories (torch_extensions, inductor)."""
    counts: dict[str, int] = {}
    for kind in ("torch_extensions", "inductor"):
        counts[kind] = sum(1 for path in cache.glob(f"compile/*/{kind}/**/*") if path.is_file())
    return counts


def check_compiled(server: Server) -> float:
    """The runtime's own compile-and-warm-up seconds from its log; exits if it fell back."""
    text = server.log_path.read_text(errors="replace")
    if FELL_BACK.search(text) or not (found := COMPILED.search(text)):
        raise SystemExit(f"{server.name} did not run compiled; its log ends with:\n{text[-3000:]}")
    return float(found.group(1))


def start_twice(make: Any, cache: Path) -> list[dict[str, Any]]:
    """Starts the server made by `make(cache)` twice on `cache` (empty at first); each start's
    seconds to ready, the runtime's compile seconds and the cache's files after it."""
    starts = []
    for which in ("first", "second"):
        server = make(cache)
        try:
            server.start(timeout_s=900)
        finally:
            server.stop()
        compile_s = check_compiled(server)
        files = cache_files(cache)
        starts.append({"start": which, "ready_s": server.ready_s, "compile_s": compile_s, **files})
        log(f"{server.name} {which} start: ready in {server.ready_s:.1f} s, compiled in "
            f"{compile_s:.1f} s, cache {files}")  # fmt: skip
    return starts


def fresh_cache(root: Path, name: str) -> Path:
    cache = root / name
    cache.mkdir()
    os.chown(cache, RUNTIME_USER, RUNTIME_USER)  # as the init container leaves a hostPath
    return cache


def machine_state() -> str:
    load = os.getloadavg()
    return f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min)"


def rows_of(medians: list[tuple[Load, dict[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    return [
        {
            "load": load.name,
            "requests": len(load.specs),
            "concurrency": load.concurrency,
            "image": sides["image"],
            "venv": sides["venv"],
            "tok_s_ratio": ratio(
                sides["image"]["output_tokens_per_s"], sides["venv"]["output_tokens_per_s"]
            ),
            "tpot_p50_ratio": ratio(sides["image"]["tpot_p50_s"], sides["venv"]["tpot_p50_s"]),
        }
        for load, sides in medians
    ]


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The runtime image's `--compile` against the venv's, side by side on this CPU",
        "",
        f"Produced by `{report['command']}` on {report['when']} ({report['machine']}; "
        f"{report['state_before']} before, {report['state_after']} after), "
        f"{report['reps']} alternating runs per side and load; medians. Image: "
        f"`{report['image']}` ({report['image_id'][:12]}, {report['image_gib']:.2f} GiB). "
        "Each server in a cpu cgroup of its own, as a pod is (VENV_CGROUP in the script). "
        "Ratios are image ÷ venv: tok/s ≥ 0.9 and TPOT ≤ 1.1 are the goal.",
        "",
        f"- venv: `{report['venv_command']}`",
        f"- image: `{report['image_command']}`",
        "",
        "| load | image tok/s | venv tok/s | tok/s ratio | TPOT P50 image / venv (ms) "
        "| TPOT ratio |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        image, venv = row["image"], row["venv"]
        lines.append(
            f"| {row['load']} ({row['requests']} req, {row['concurrency']} at once) "
            f"| {image['output_tokens_per_s']:.0f} | {venv['output_tokens_per_s']:.0f} "
            f"| {ratio_text(row['tok_s_ratio'])} "
            f"| {image['tpot_p50_s'] * 1e3:.2f} / {venv['tpot_p50_s'] * 1e3:.2f} "
            f"| {ratio_text(row['tpot_p50_ratio'])} |"
        )
    lines += [
        "",
        "Starts on an empty cache directory, then again on the same one (seconds from the start "
        "command to `/readyz`; compile: the runtime's own figure for the kernels, the compiled "
        "step and its warm-up step; files: under the cache's torch_extensions/ and inductor/):",
        "",
        "| side | start | ready s | compile s | extension files | inductor files |",
        "|---|---|---|---|---|---|",
    ]
    for side, starts in report["starts"].items():
        for s in starts:
            lines.append(
                f"| {side} | {s['start']} | {s['ready_s']:.1f} | {s['compile_s']:.1f} "
                f"| {s['torch_extensions']} | {s['inductor']} |"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tok, ax_tpot) = plt.subplots(1, 2, figsize=(11, 4))
    sides = ("venv", "image")
    side_by_side_bars(ax_tok, ax_tpot, report["rows"], sides, "p50", "--compile, image vs venv")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=images.RUNTIME.tag, help="the runtime image to run")
    parser.add_argument("--model", default="tiny", help="a builtin model")
    parser.add_argument("--reps", type=int, default=9, help="runs per side and load")
    parser.add_argument(
        "--scale", type=float, default=2.0, help="request counts (runtime_vs_vllm's loads)"
    )
    parser.add_argument("--out", default=str(RESULTS / "runtime_image"))
    args = parser.parse_args(argv)
    image_id = images.image_id(args.image)
    if image_id is None:
        parser.error(f"{args.image} is not in the local store: build it (make image)")
    state_before = machine_state()
    chosen = [load for load in loads(args.scale) if load.name in LOADS]
    with tempfile.TemporaryDirectory(prefix="wok-runtime-image-") as scratch:
        root = Path(scratch)
        os.chmod(root, 0o755)  # the container's user reaches its cache directory through it
        logs = root / "logs"
        logs.mkdir()
        # one path for both sides, reachable by the container's user (~ is root's alone)
        model_dir = Path(shutil.copytree(ensure_builtin(args.model), root / args.model))
        info = ["--log-level", "info"]
        starts = {
            "image": start_twice(
                lambda c: image_server(args.image, model_dir, logs, c, info),
                fresh_cache(root, "image-starts"),
            ),
            "venv": start_twice(
                lambda c: venv_server(model_dir, logs, c, info), fresh_cache(root, "venv-starts")
            ),
        }
        # the loads on the caches the starts filled: both sides start as a second pod would
        servers = [
            image_server(args.image, model_dir, logs, root / "image-starts", []),
            venv_server(model_dir, logs, root / "venv-starts", []),
        ]
        try:
            medians = alternating_medians(servers, chosen, args.reps, tag=args.model)
        finally:
            for server in servers:
                server.stop()
            with contextlib.suppress(OSError):  # empty once the venv server has exited
                VENV_CGROUP.rmdir()
    image, venv = servers
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work",
        "state_before": state_before,
        "state_after": machine_state(),
        "command": shlex.join(["python", "bench/runtime/runtime_image.py", *sys.argv[1:]]),
        "image": args.image,
        "image_id": image_id,
        "image_gib": images.image_size(args.image) / 2**30,
        "reps": args.reps,
        "venv_command": " ".join(f"{k}={v}" for k, v in WOK_ENV.items())
        + " "
        + shlex.join(["wok", *venv.command[venv.command.index("wok.cli") + 1 :]]),
        "image_command": "CONTAINERS_CONF=… " + shlex.join(image.command),
        "starts": starts,
        "rows": rows_of(medians),
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    plot(report, out.with_suffix(".png"))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
