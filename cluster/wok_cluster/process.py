"""Child processes the harness starts, each in its own process group, stopped by pid only.

Every process runs in a new session (its own process group) so that stopping it also stops what it
spawned, and so that `wok dev up` can exit while the cluster keeps running. Stopping never matches
by name: only groups whose leader pid we recorded, and only while that pid still runs the program
we started (pids are recycled).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Every process of one run carries this variable (value: the run directory), pod processes too:
# the leftover check finds anything of a run that outlived its teardown, whatever it is called.
RUN_MARKER = "WOK_CLUSTER_RUN"


@dataclass(frozen=True)
class ProcessRecord:
    """What is needed to find and stop a started process later, possibly from another process."""

    name: str
    pid: int
    executable: str
    log: str


def start_process(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    return popen, ProcessRecord(name=name, pid=popen.pid, executable=argv[0], log=str(log))


def command_line(pid: int) -> list[str] | None:
    """argv of a live, non-zombie process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return None
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_ours(record: ProcessRecord) -> bool:
    """The recorded pid still runs the recorded program (a script shows as `python script`)."""
    argv = command_line(record.pid)
    return argv is not None and record.executable in argv[:2]


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is `pgid` (children that outlived their leader included)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def stop_group(pgid: int, *, grace: float, reap: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the group, SIGKILL what is left after `grace` seconds, wait until it is gone."""
    for sig, wait_for in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_for
        while time.monotonic() < deadline:
            # a multi-threaded leader shows as a zombie before it can be waited for: done only
            # once our own child is reaped, not merely when the group looks empty
            reaped = reap is None or reap.poll() is not None
            if reaped and not group_members(pgid):
                return
            time.sleep(0.05)


def stop_recorded(record: ProcessRecord, *, grace: float = 10.0) -> bool:
    """Stops a recorded process group if its leader is still the program we started.

    Returns False when there was nothing of ours left to stop. A live leader that runs something
    else is a recycled pid: left alone. With the leader gone, members of its group are ours (Linux
    never hands out a pid still in use as a process group id).
    """
    leader_alive = command_line(record.pid) is not None
    if is_ours(record) or (not leader_alive and group_members(record.pid)):
        stop_group(record.pid, grace=grace)
        return True
    return False


def processes_marked(run_marker: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries RUN_MARKER=`run_marker`: a run's leftovers."""
    needle = f"{RUN_MARKER}={run_marker}".encode()
    found = []
    own = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
            continue
        found.append((int(entry.name), cmdline.strip()))
    return found


def log_tail(path: str | Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class Supervisor:
    """The processes one harness object started, stopped in reverse start order."""

    def __init__(self, run_marker: str | None = None) -> None:
        self.run_marker = run_marker
        self._started: list[tuple[subprocess.Popen[bytes] | None, ProcessRecord]] = []

    @property
    def records(self) -> list[ProcessRecord]:
        return [record for _, record in self._started]

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        full_env = dict(os.environ if env is None else env)
        if self.run_marker is not None:
            full_env[RUN_MARKER] = self.run_marker
        popen, record = start_process(name, argv, log=log, env=full_env, cwd=cwd)
        self._started.append((popen, record))
        return popen

    def adopt(self, records: Sequence[ProcessRecord]) -> None:
        """Takes over processes another invocation started (`wok dev down`)."""
        self._started.extend((None, record) for record in records)

    def check_alive(self, popen: subprocess.Popen[bytes]) -> None:
        """Raises GiveUp with the log tail if `popen` has exited: waiting for it is pointless."""
        from wok_cluster.waiting import GiveUp

        if popen.poll() is not None:
            record = next(r for p, r in self._started if p is popen)
            raise GiveUp(
                f"{record.name} exited with {popen.returncode}; log {record.log}:\n"
                + log_tail(record.log)
            )

    def stop_all(self, *, grace: float = 10.0) -> None:
        while self._started:
            popen, record = self._started.pop()
            if popen is not None:
                if popen.poll() is None or group_members(record.pid):
                    stop_group(record.pid, grace=grace, reap=popen)
            else:
                stop_recorded(record, grace=grace)
