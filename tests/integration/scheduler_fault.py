"""Fault injection for the engine-failure tests: `wok` in a real process whose scheduler raises
on demand. Not a mock: everything is the real runtime except the one call that is made to fail.

Usage: `python scheduler_fault.py runtime serve …` with `WOK_TEST_FAULT_FILE` naming a file. While
that file holds `schedule`, every `Scheduler.schedule` with a request to serve raises (the loop
cannot continue; an idle pass of the loop must not trip it before the request arrives); when it
holds `postprocess`, the next `Scheduler.postprocess` raises once and the file is removed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from wok.cli import main
from wok_runtime.core.scheduler import Scheduler

TRIGGER = Path(os.environ["WOK_TEST_FAULT_FILE"])
_schedule = Scheduler.schedule
_postprocess = Scheduler.postprocess


def _armed(fault: str) -> bool:
    try:
        return TRIGGER.read_text().strip() == fault
    except FileNotFoundError:
        return False


def schedule(self: Scheduler, now: float) -> Any:
    if self.has_work() and _armed("schedule"):
        raise RuntimeError("injected scheduler fault")
    return _schedule(self, now)


def postprocess(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
    if _armed("postprocess"):
        TRIGGER.unlink()
        raise RuntimeError("injected post-processing fault")
    return _postprocess(self, *args, **kwargs)


Scheduler.schedule = schedule  # type: ignore[method-assign]
Scheduler.postprocess = postprocess  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
