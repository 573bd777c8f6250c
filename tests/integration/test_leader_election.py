"""Leader election on a real apiserver: one holder; a partitioned holder lets go before another
replica can take over (the margin between renew deadline and lease duration); a stop releases."""

from __future__ import annotations

import time

import pytest
from kubernetes import client, config

from wok_operator.leader import Candidate, LeaseLost, LeaseTimes

pytestmark = pytest.mark.integration

TIMES = LeaseTimes(lease_duration_s=4, renew_deadline_s=3, retry_period_s=1)


class Replica:
    """A candidate with its own API client (partitionable) and a record of when it lost."""

    def __init__(self, kubeconfig, namespace: str, identity: str) -> None:
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.lost_at: float | None = None
        self.lost_why = ""
        self.candidate = Candidate(
            self.api,
            name="wok-operator",
            namespace=namespace,
            identity=identity,
            times=TIMES,
            on_lost=self._lost,
        )
        self.candidate.start()

    def _lost(self, why: str) -> None:
        self.lost_at, self.lost_why = time.monotonic(), why

    def partition(self) -> None:
        """Every later API call of this replica fails (nothing listens on port 9)."""
        # The kubeconfig loader's refresh hook would set the host back before each request.
        self.api.configuration.refresh_api_key_hook = None
        self.api.configuration.host = "https://127.0.0.1:9"

    def holder(self, namespace: str, kubeconfig) -> str:
        lease = client.CoordinationV1Api(
            config.new_client_from_config(config_file=str(kubeconfig))
        ).read_namespaced_lease("wok-operator", namespace)
        return lease.spec.holder_identity


def test_one_holder_and_a_partitioned_holder_lets_go_before_the_takeover(
    wok_kubeconfig, wok_namespace
):
    first = Replica(wok_kubeconfig, wok_namespace, "first")
    assert first.candidate.wait_until_leading(timeout=30)
    second = Replica(wok_kubeconfig, wok_namespace, "second")
    try:
        # The second waits while the first renews: several lease durations pass without a change.
        assert not second.candidate.wait_until_leading(timeout=3 * TIMES.lease_duration_s)
        assert first.candidate.holds() and not second.candidate.holds()
        assert second.candidate.holder == "first"
        assert first.holder(wok_namespace, wok_kubeconfig) == "first"

        first.partition()
        partitioned_at = time.monotonic()
        assert second.candidate.wait_until_leading(timeout=6 * TIMES.lease_duration_s)
        took_over_at = time.monotonic()
        assert first.holder(wok_namespace, wok_kubeconfig) == "second"

        # The partitioned holder gave up before the other could act, and refuses to act now.
        assert first.lost_at is not None, "the partitioned holder never let go"
        assert first.lost_at < took_over_at, (first.lost_at - partitioned_at, took_over_at)
        assert first.lost_at - partitioned_at <= TIMES.renew_deadline_s + TIMES.retry_period_s
        assert not first.candidate.holds()
        with pytest.raises(LeaseLost):
            first.candidate.ensure_holds()
        assert second.candidate.holds()
    finally:
        second.candidate.stop()  # as on SIGTERM, once Kopf has stopped
    # Released: nobody holds it, so a standby need not wait for it to run out.
    assert first.holder(wok_namespace, wok_kubeconfig) is None
    assert not second.candidate.holds()
