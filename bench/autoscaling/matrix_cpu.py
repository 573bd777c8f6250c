"""The CPU cost of `wok evaluate`'s whole default matrix, every swept baseline included,
estimated from a timed sample of its jobs: a shared machine cannot spare the matrix's whole run
to time it, and the simulations are deterministic, so a job's CPU seconds do not depend on when
it runs.

The jobs are those of a journal that holds a whole matrix's simulations (or a part, plus the
first seed of every swept baseline the journal lacks, from `first_jobs`: those it would run);
they are grouped by trace and kind (the law, a static fleet, each swept baseline), every k-th of
each group is run here, one at a time, its CPU seconds timed (`time.process_time`, the arrivals
and the planner's warm start built before the clock starts, as a worker keeps them between
jobs), and each group's mean times its count is its estimate.

    nice -n 10 .venv/bin/python bench/autoscaling/matrix_cpu.py --journal J --every 50 \\
        --out bench/autoscaling/results/matrix_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from wok_sim.evaluation_journal import Journal
from wok_sim.evaluation_matrix import ON_REQUEST, STATIC, SWEPT_BASELINES, Job, context, matrix
from wok_sim.evaluation_runner import first_jobs, run_job


def kind(job: Job) -> str:
    return job.policy if job.policy in (STATIC, *SWEPT_BASELINES) else "the law's"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--every", type=int, default=20, help="time every k-th job of a group")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    done = set(Journal(args.journal).done)
    conditions = matrix()
    default = {c for c in conditions if c.trace not in ON_REQUEST}
    jobs = {j for j in done if j.condition in default}
    jobs |= set(first_jobs(sorted(default), []))
    groups: dict[tuple[str, str], list[Job]] = defaultdict(list)
    for job in sorted(jobs, key=lambda j: (j.condition, j.seed, j.policy, j.variant)):
        groups[(job.condition.trace, kind(job))].append(job)
    rows, total = [], 0.0
    for (trace, what), members in sorted(groups.items()):
        timed = []
        for job in members[:: args.every]:
            context(job.condition, job.seed, warm_start_fleet=job.policy != STATIC)
            started = time.process_time()
            run_job(job)
            timed.append(time.process_time() - started)
        mean = statistics.fmean(timed)
        total += mean * len(members)
        rows.append(f"| {trace} | {what} | {len(members)} | {len(timed)} | {mean:.2f} "
                    f"| {mean * len(members) / 60:.1f} |")  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
    command = "nice -n 10 .venv/bin/python bench/autoscaling/matrix_cpu.py " + " ".join(
        sys.argv[1:]
    )
    lines = [
        "# The CPU cost of `wok evaluate`'s whole default matrix",
        "",
        f"Command: `{command}`",
        "",
        "14 conditions, every swept baseline (HPA, KEDA, AIBrix KPA / APA, Dynamo's planner, "
        "WVA) on the first seed, the static frontiers' searches and the other seeds the journal "
        "ran; the swept baselines' other seeds that the journal lacks are not counted. Each job "
        "timed alone in one process (CPU seconds, arrivals and warm start built before the "
        "clock), on the project's shared 2-core machine.",
        "",
        "| trace | jobs | count | timed | mean CPU s | estimate CPU min |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Estimate: {total / 60:.1f} CPU-minutes for {len(jobs)} simulations; on two cores "
        f"{total / 120:.1f} minutes of wall time.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
