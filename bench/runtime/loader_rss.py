"""Peak host memory (RSS) of loading a model with the runtime's loader, in a fresh process each.

Why: a GPU pod's memory limit is sized from the weights held on the host while they load plus
the runtime's overhead (wok_operator.budget.pod_memory_bytes). A loader that reads the whole
checkpoint into RAM and then makes fused copies holds two to three times the weights, and is
OOM-killed under such a limit; one that streams tensor by tensor holds about the weights once
(on the CPU, where they stay) or one tensor (on a GPU). This measures which one we have.

Each load runs in a child process: RSS after importing torch and the runtime (the baseline),
the peak RSS (`ru_maxrss`) after `load_model`, and their difference against the weights' size.

    .venv/bin/python bench/runtime/loader_rss.py --model builtin:smollm2-135m \
        --dtype float32 bfloat16
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def child(model: str, dtype: str, device: str) -> dict[str, object]:
    import torch

    from wok_runtime.core.loader import load_model, parse_dtype, resolve_source

    path = resolve_source(model)  # generated and cached before the baseline
    baseline = _rss_bytes()
    started = time.perf_counter()
    loaded = load_model(path, dtype=parse_dtype(dtype), device=torch.device(device))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    weights = sum(p.numel() * p.element_size() for p in loaded.state_dict().values())
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in loaded.parameters()}
    return {
        "model": model,
        "dtype": dtype,
        "device": device,
        "baseline_rss": baseline,
        "peak_rss": peak,
        "after_rss": _rss_bytes(),
        "weights_bytes": sum(unique.values()) if unique else weights,
        "load_seconds": round(seconds, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.dtype[0], args.device)))
        return 0
    mib = 2**20
    if not args.json:
        print("| model | dtype | device | weights | baseline RSS | peak RSS | peak − baseline "
              "| (peak − baseline) / weights | load s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
    for dtype in args.dtype:
        argv = [sys.executable, __file__, "--child", "--model", args.model, "--dtype", dtype,
                "--device", args.device]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        if args.json:
            print(json.dumps(r))
            continue
        extra = r["peak_rss"] - r["baseline_rss"]
        print(
            f"| {r['model']} | {dtype} | {r['device']} | {r['weights_bytes'] / mib:.0f} MiB "
            f"| {r['baseline_rss'] / mib:.0f} MiB | {r['peak_rss'] / mib:.0f} MiB "
            f"| {extra / mib:.0f} MiB | {extra / r['weights_bytes']:.2f} | {r['load_seconds']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
