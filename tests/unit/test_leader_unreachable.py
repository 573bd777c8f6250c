"""A standby that cannot reach the apiserver keeps trying, and says why once, not at every try."""

from __future__ import annotations

import logging
import socket

from kubernetes import client

from wok_operator.leader import Candidate, LeaseTimes


def test_a_standby_that_cannot_reach_the_apiserver_says_so_once(caplog):
    lost: list[str] = []
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        configuration = client.Configuration()
        configuration.host = f"https://127.0.0.1:{unused.getsockname()[1]}"
        candidate = Candidate(
            client.ApiClient(configuration),
            name="wok-operator",
            namespace="default",
            identity="standby",
            times=LeaseTimes(lease_duration_s=4, renew_deadline_s=3, retry_period_s=1),
            on_lost=lost.append,
        )
        with caplog.at_level(logging.WARNING, logger="wok.leader"):
            candidate.start()
            assert not candidate.wait_until_leading(timeout=3.5)  # about three tries
            candidate.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "wok.leader"]
    assert len(said) == 1 and "cannot read the lease default/wok-operator" in said[0], said
    assert "Connection refused" in said[0]
    assert lost == [] and not candidate.holds()
