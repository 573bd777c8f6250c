"""Operator replicas on one Lease: only the holder acts; a killed holder is replaced, a stopped one
hands over at once, and a frozen holder that wakes up after being replaced exits without acting."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from operator_harness import (
    NO_PROMETHEUS,
    OperatorProcess,
    get_json,
    install_crds,
    kubectl,
    reconciled,
    service,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # times the lease handover: alone

# Short times keep the test quick; the margins are client-go's proportions (15/10/2 s).
LEASE = ["--lease-duration=6", "--renew-deadline=4", "--retry-period=1"]
LEADS = "leads: acquired the lease"
ACTS = "reconciled: batch"


def replica(wok_cluster, ns: str, log) -> OperatorProcess:
    return OperatorProcess(
        wok_cluster.kubeconfig,
        ns,
        NO_PROMETHEUS,
        log,
        standalone=False,
        extra_args=LEASE,
        run_marker=str(wok_cluster.run_dir),
    )


def holder(kc, ns: str) -> str | None:
    lease = get_json(kc, "lease", "wok-operator", "-n", ns) or {}
    return lease.get("spec", {}).get("holderIdentity")


def text(process: OperatorProcess, since: int = 0) -> str:
    return process.log.read_text(errors="replace")[since:]


def leader_metric(process: OperatorProcess) -> float:
    for line in process.metrics().splitlines():
        if line.startswith("wok_operator_leader "):
            return float(line.split()[1])
    raise AssertionError("wok_operator_leader is not exported")


def patch_spec(kc, ns: str, name: str, max_wait_ms: int) -> None:
    patch = f'{{"spec": {{"batching": {{"maxWaitMs": {max_wait_ms}}}}}}}'
    kubectl(kc, "patch", "wis", name, "-n", ns, "--type=merge", "-p", patch)


@pytest.fixture
def pair(wok_cluster, wok_namespace, tmp_path) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    """Two replicas: the first holds the lease, the second is a live standby."""
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    install_crds(kc)
    first = replica(wok_cluster, ns, tmp_path / "first.log")
    first.wait_live()
    wait_for(lambda: LEADS in text(first), "the first replica leads", 30)
    second = replica(wok_cluster, ns, tmp_path / "second.log")
    try:
        second.wait_live()  # a standby answers liveness while it waits
        yield first, second
    finally:
        if first.alive():
            os.killpg(first.popen.pid, signal.SIGCONT)
            first.stop()
        kubectl(kc, "delete", "wis", "--all", "-n", ns, "--wait=true")
        assert second.stop() == 0, second.log_tail()


def test_only_the_holder_acts_a_killed_one_is_replaced_a_stopped_one_hands_over(
    pair, wok_cluster, wok_namespace, tmp_path
):
    first, second = pair
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=service("ha-0") + "---\n" + service("ha-1"))
    for name in ("ha-0", "ha-1"):
        wait_for(lambda n=name: reconciled(kc, ns, n), f"{name} reconciled", 60)
    time.sleep(3)  # several ticks of both control loops
    assert text(first).count(ACTS) >= 2
    assert ACTS not in text(second) and LEADS not in text(second)
    assert "is held by" in text(second)
    assert (leader_metric(first), leader_metric(second)) == (1.0, 0.0)
    first_identity = holder(kc, ns)
    assert first_identity and first_identity in text(first)
    third = replica(wok_cluster, ns, tmp_path / "third.log")
    try:
        third.wait_live()

        first.kill9()
        killed_at = time.monotonic()
        # Either standby may win the race for the expired lease.
        standbys = [second, third]
        wait_for(lambda: any(LEADS in text(p) for p in standbys), "a standby takes over", 60)
        takeover_s = time.monotonic() - killed_at
        new, last = standbys if LEADS in text(second) else standbys[::-1]
        patch_spec(kc, ns, "ha-0", 20)
        wait_for(lambda: reconciled(kc, ns, "ha-0"), "the new holder reconciles", 60)
        assert ACTS in text(new) and ACTS not in text(last)
        new_identity = holder(kc, ns)
        assert new_identity not in (None, first_identity) and new_identity in text(new)
        assert leader_metric(new) == 1.0

        # A graceful stop releases the lease: the last standby leads without waiting it out.
        assert new.stop() == 0, new.log_tail()
        stopped_at = time.monotonic()
        wait_for(lambda: LEADS in text(last), "the last standby takes over", 60)
        handover_s = time.monotonic() - stopped_at
        assert "released the lease" in text(new)
        assert holder(kc, ns) not in (None, first_identity, new_identity)
        assert handover_s < 6, f"{handover_s:.1f} s: the lease ran out instead of being released"
        print(f"\ntakeover after kill -9: {takeover_s:.1f} s; after SIGTERM: {handover_s:.1f} s")
    finally:
        # The last holder removes the finalizers, then stops (the fixture stops the second).
        kubectl(kc, "delete", "wis", "--all", "-n", ns, "--wait=true")
        assert third.stop() == 0, third.log_tail()


def test_a_frozen_holder_that_was_replaced_exits_without_acting(pair, wok_cluster, wok_namespace):
    first, second = pair
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=service("frozen"))
    wait_for(lambda: reconciled(kc, ns, "frozen"), "reconciled by the first", 60)

    # Freeze the holder (as a stalled node would): the standby takes over after the lease.
    os.killpg(first.popen.pid, signal.SIGSTOP)
    wait_for(lambda: LEADS in text(second), "the standby takes over", 60)
    # Work the frozen one would see on waking: its open watch stream carries this update.
    patch_spec(kc, ns, "frozen", 20)
    wait_for(lambda: reconciled(kc, ns, "frozen"), "the new holder reconciles", 60)
    frozen_log = len(text(first))
    os.killpg(first.popen.pid, signal.SIGCONT)

    assert first.popen.wait(30) == 1, first.log_tail()
    woke = text(first, frozen_log)
    assert "lost the lease" in woke, woke
    assert ACTS not in woke, woke
    assert second.alive() and ACTS in text(second)
