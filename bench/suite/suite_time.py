"""Times the suite as `make test` runs it: the whole command's wall time and each pytest pass's
own (its summary line), with the pass/fail counts and the slowest tests it printed.

Why: `make test` must stay under 15 minutes of pytest on a 2-core machine (docs/testing.md). The
figure is a run of the real target, not a sum of per-test durations: the parallel pass's time is
its longest worker's, plus each worker's cluster start.

    .venv/bin/python bench/suite/suite_time.py                  # make test, once
    .venv/bin/python bench/suite/suite_time.py --runs 2 -- WORKERS=2

Each run's full output goes to out/suite_time-<n>.log; one JSON line per run is printed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# pytest's last line, "3 failed, 640 passed, 185 deselected in 225.53s (0:03:45)" (`=` around
# it without -q)
SUMMARY = re.compile(
    r"^(?:=+ )?(?P<counts>[0-9]+ [a-z]+.*?) in (?P<seconds>[0-9.]+)s(?: \([0-9:]+\))?(?: =+)?$",
    re.M,
)
SLOW = re.compile(r"^(?P<seconds>[0-9.]+)s (?:call|setup|teardown) +(?P<test>\S+)$", re.M)


def passes(output: str) -> list[dict[str, object]]:
    """Each pytest pass's counts and seconds, in the order they ran."""
    return [
        {"counts": m["counts"], "seconds": float(m["seconds"])} for m in SUMMARY.finditer(output)
    ]


def slowest(output: str, top: int = 8) -> list[tuple[float, str]]:
    found = [(float(m["seconds"]), m["test"]) for m in SLOW.finditer(output)]
    return sorted(found, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--target", default="test")
    parser.add_argument("make_args", nargs="*", help="after --: variables for make (WORKERS=2)")
    args = parser.parse_args()
    (ROOT / "out").mkdir(exist_ok=True)
    for run in range(1, args.runs + 1):
        log = ROOT / "out" / f"suite_time-{run}.log"
        started = time.monotonic()
        with log.open("w") as out:
            done = subprocess.run(
                ["make", args.target, *args.make_args],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        wall = time.monotonic() - started
        output = log.read_text()
        found = passes(output)
        record = {
            "command": " ".join(["make", args.target, *args.make_args]),
            "run": run,
            "exit": done.returncode,
            "make_wall_s": round(wall, 1),
            "pytest_s": round(sum(float(p["seconds"]) for p in found), 1),
            "passes": found,
            "slowest": slowest(output),
            "log": str(log.relative_to(ROOT)),
        }
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
