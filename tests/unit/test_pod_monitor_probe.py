"""A reconcile asks whether the cluster serves PodMonitors; the operator reads the CRD again only
when its last finding is old (a GET per reconcile was 1,000 GETs when 1,000 services resumed),
and sees a CRD installed after its start within `POD_MONITORS_MISSING_S`."""

from __future__ import annotations

from dataclasses import dataclass

from wok_operator.handlers import (
    POD_MONITORS_MISSING_S,
    POD_MONITORS_PRESENT_S,
    OperatorConfig,
    Shared,
    pod_monitors_present,
)


@dataclass
class FakeCrdReads:
    """Stands in for `actuate.Kube`'s CRD read: counts the GETs, answers `installed`."""

    installed: bool = False
    reads: int = 0

    def has_pod_monitors(self) -> bool:
        self.reads += 1
        return self.installed


def test_the_crd_is_read_once_per_period_not_per_reconcile() -> None:
    kube = FakeCrdReads(installed=True)
    wok = Shared(kube=kube, config=OperatorConfig())  # type: ignore[arg-type]
    assert all(pod_monitors_present(wok, now=100.0 + i * 0.01) for i in range(1000))
    assert kube.reads == 1
    assert pod_monitors_present(wok, now=100.0 + POD_MONITORS_PRESENT_S)
    assert kube.reads == 2


def test_a_crd_installed_after_the_start_is_seen_within_the_missing_period() -> None:
    kube = FakeCrdReads(installed=False)
    wok = Shared(kube=kube, config=OperatorConfig())  # type: ignore[arg-type]
    assert not pod_monitors_present(wok, now=0.0)
    kube.installed = True  # the Prometheus Operator's CRDs arrive
    assert not pod_monitors_present(wok, now=POD_MONITORS_MISSING_S - 1.0)
    assert pod_monitors_present(wok, now=POD_MONITORS_MISSING_S)
    assert kube.reads == 2
