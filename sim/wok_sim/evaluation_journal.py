"""`wok evaluate --journal`: each finished simulation as one JSON line, read back to skip it."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wok_sim.evaluation_matrix import Condition, Job, Outcome


class Journal:
    """Each finished simulation as one JSON line, so that a run stopped halfway (the shared
    machine, a deadline) continues where it stopped: a job found in the journal is not run
    again. Floats are written in full, so a result read back is the one computed. Only for the
    same code: the journal does not know which law or simulator wrote it. A run killed while
    writing leaves its last line cut short: that line is dropped (its simulation runs again),
    and the file is cut back to the lines it keeps, so the next ones start on a line of their
    own."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done: dict[Job, Outcome] = {}
        if path is None or not path.exists():
            return
        text = path.read_text()
        whole = text[: text.rfind("\n") + 1]  # a last line without its newline was cut short
        for number, line in enumerate(whole.splitlines(), start=1):
            if line.strip():
                try:
                    o = _outcome_of(json.loads(line))
                except (json.JSONDecodeError, KeyError, TypeError) as error:
                    raise ValueError(f"{path}:{number} is not a journal line: {error}") from None
                self.done[o.job] = o
        if whole != text:
            path.write_text(whole)

    def add(self, outcome: Outcome) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(_line_of(outcome)) + "\n")


def _line_of(o: Outcome) -> dict[str, Any]:
    return {
        **asdict(o.job.condition),
        **{k: getattr(o.job, k) for k in ("seed", "policy", "variant")},
        **{k: getattr(o, k) for k in ("name", "batch", "attainment", "gpu_hours", "wall_s")},
    }


def _outcome_of(line: dict[str, Any]) -> Outcome:
    condition = Condition(*(line[f] for f in ("trace", "scale", "cold_start_s", "slo")))
    job = Job(condition, line["seed"], line["policy"], line["variant"])
    fields = ("name", "batch", "attainment", "gpu_hours", "wall_s")
    return Outcome(job, *(line[f] for f in fields))
