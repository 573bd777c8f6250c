"""The fleet simulator's speed on a sample of `wok evaluate`'s jobs, side by side with a commit.

`wok evaluate` must run its whole default matrix in 30 minutes on the project's 2-core machine,
so the simulator's speed is a requirement. This runs the same jobs (one per kind of condition of
the matrix) with the working tree's packages and with those of `--against` (a commit, exported
with `git archive`), alternating in fresh processes, and reports each job's median CPU seconds
(the process's own, so that other work on the shared machine does not count) on both sides and
their ratio; it also checks that both sides give the same attainment and
GPU-hours to the last digit (a faster simulator must not change a result).

    nice -n 19 .venv/bin/python bench/sim_speed.py --against f4d1ed6 --repeats 3

Writes bench/results/sim_speed.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("", "batch", "cluster", "contracts", "operator", "runtime", "sim")
# (trace, scale, pod start, SLO set, seed, policy, variant): one job of each kind the matrix runs.
JOBS = [
    ("code", 4.0, 180.0, "loose", 1, "wok", 0),
    ("code", 3.0, 90.0, "tight", 2, "wok", 0),
    ("code", 3.0, 90.0, "loose", 0, "static", 5064),
    ("code", 3.0, 90.0, "loose", 0, "hpa-concurrency-swept", 3),
    ("conv", 1.0, 90.0, "loose", 3, "wok", 0),
    ("conv", 1.0, 90.0, "loose", 0, "keda-waiting-swept", 2),
    ("mooncake", 1.0, 30.0, "tight", 4, "wok", 0),
]
CHILD = """
import json, sys, time
from wok_sim import evaluate as e
out = {}
for trace, scale, start, slo, seed, policy, variant in json.loads(sys.argv[1]):
    job = e.Job(e.Condition(trace, scale, start, slo), seed, policy, variant)
    e.context(job.condition, seed, warm_start_fleet=policy != e.STATIC)  # not timed
    t = time.process_time()  # CPU seconds: the shared machine's load does not count
    o = e.run_job(job)
    label = f"{trace} x{scale:g} {start:g} s {slo} seed {seed} {o.name}" + (
        f" B{o.batch}" if o.batch else "")
    out[label] = [time.process_time() - t, o.name, o.attainment, o.gpu_hours]
print(json.dumps(out))
"""


def export(commit: str, into: Path) -> Path:
    """The commit's tree under `into` (no work tree or branch is touched)."""
    archive = into / "tree.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", commit], cwd=ROOT, stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def run_side(root: Path) -> dict[str, list]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / p) for p in PACKAGES)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(JOBS)],
        cwd=root, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, metavar="COMMIT")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="sim_speed")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    started = time.monotonic()
    times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    results: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"before": export(args.against, Path(tmp)), "after": ROOT}
        for _ in range(args.repeats):
            for side, root in sides.items():
                for job, (seconds, *result) in run_side(root).items():
                    times[side].setdefault(job, []).append(seconds)
                    results.setdefault(job, {})[side] = result
    rows, ratios = [], []
    for (job, before), after in zip(times["before"].items(), times["after"].values(), strict=True):
        b, a = statistics.median(before), statistics.median(after)
        same = results[job]["before"] == results[job]["after"]
        ratios.append(b / a)
        rows.append(f"| {job} | {b:.2f} | {a:.2f} | {b / a:.2f}× | {'yes' if same else '**no**'} |")
    command = "nice -n 19 .venv/bin/python bench/sim_speed.py " + " ".join(sys.argv[1:])
    text = "\n".join(
        [
            "# The fleet simulator's speed on a sample of `wok evaluate`'s jobs",
            "",
            f"Made by `{command}` in {time.monotonic() - started:.0f} s on the project's shared "
            f"2-core machine: median CPU seconds of {args.repeats} runs per side, alternating, "
            "each in a fresh process (context built before the clock starts). Before: "
            f"{args.against}; after: the working tree. Same result: attainment, GPU-hours and "
            "the variant's name equal to the last digit.",
            "",
            "| job | before CPU s | after CPU s | speed-up | same result |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Median speed-up {statistics.median(ratios):.2f}×; total "
            f"{sum(statistics.median(v) for v in times['before'].values()):.1f} s → "
            f"{sum(statistics.median(v) for v in times['after'].values()):.1f} s.",
            "",
        ]
    )
    results_dir = ROOT / "bench" / "results"
    (results_dir / f"{args.out}.md").write_text(text)
    payload = {"command": command, "times": times, "results": results}
    (results_dir / f"{args.out}.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
