"""The alert rules (charts/wok/files/alerts.yaml): every series they read is exported, and the
operator's SLO gauges they read follow each service. (promtool's checks and rule unit tests need
Debian's prometheus package: tests/integration/test_alert_rules_promtool.py, `make test`.)"""

import math
import re
from pathlib import Path
from types import SimpleNamespace

import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase
from test_metric_contract import EXPORTED, named_series

from wok_contracts.metrics import REJECT_QUEUE_FULL, MetricSpec, series_names
from wok_operator import handlers, metrics

ROOT = Path(__file__).parents[2]
RULES = ROOT / "charts/wok/files/alerts.yaml"
RULES_TEST = ROOT / "charts/wok/files/alerts_test.yaml"
RECORDING_RULES = ROOT / "charts/wok/files/recording_rules.yaml"
RUNBOOK = ROOT / "docs/alerts.md"


def alert_rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def operator_series() -> set[str]:
    """The operator's series as Prometheus stores them, by the runtime's naming rule."""
    names = set()
    for collector in vars(metrics).values():
        if isinstance(collector, MetricWrapperBase):
            for f in collector.describe():
                # A histogram spec needs buckets; which ones does not change its series' names.
                buckets = (1.0,) if f.type == "histogram" else ()
                spec = MetricSpec(f.name, f.type, f.documentation, buckets=buckets)
                names.update(series_names(spec))
    return names


def recorded_series() -> dict[str, str]:
    """The chart's recording rules: recorded name → the PromQL it records."""
    groups = yaml.safe_load(RECORDING_RULES.read_text())["groups"]
    return {rule["record"]: rule["expr"] for group in groups for rule in group["rules"]}


def read_series(expr: str, recorded: dict[str, str]) -> set[str]:
    """The series `expr` reads, a recorded series replaced by those its rule reads."""
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)) & recorded.keys()
    for name in names:
        expr = expr.replace(name, f"({recorded[name]})")
    return named_series(expr) if not names else read_series(expr, recorded)


def test_every_alert_reads_exported_series():
    exported = EXPORTED | operator_series()
    recorded = recorded_series()
    for rule in alert_rules():
        named = read_series(rule["expr"], recorded)
        assert named, rule["alert"]
        assert named <= exported, f"{rule['alert']}: {named - exported} exported by no one"
    shedding = next(r for r in alert_rules() if r["alert"] == "WokLoadShedding")
    # The reason answered with 429, through the recorded rate the alert reads.
    assert f'reason="{REJECT_QUEUE_FULL}"' in recorded[shedding["expr"].split()[0]]


def test_the_alerts_read_the_runtime_through_recorded_aggregates():
    # A per-pod runtime series in an alert is evaluated at every alert evaluation: the alerts
    # read the recorded per-service aggregates instead, which the chart installs with them.
    recorded = recorded_series()
    for rule in alert_rules():
        assert not named_series(rule["expr"]) & EXPORTED - operator_series(), rule["alert"]
    reads = {name for rule in alert_rules() for name in recorded if name in rule["expr"]}
    assert reads == {
        "namespace_service:wok_rejected_requests_queue_full:rate5m",
        "namespace_service:vllm_kv_cache_usage_perc:max",
    }


def test_every_alert_has_a_severity_and_a_runbook_section():
    anchors = {h.lower() for h in re.findall(r"^## (\S+)$", RUNBOOK.read_text(), re.MULTILINE)}
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        url = rule["annotations"]["runbook_url"]
        assert url.endswith(f"docs/alerts.md#{rule['alert'].lower()}"), url
        assert rule["alert"].lower() in anchors


def service_gauges(key: tuple[str, str], slo: str = "ttft") -> list[float | None]:
    """SLO, observed P99 and budget-window P99 (of `slo`), batch size, replicas of one service
    (None: no sample)."""
    labels = dict(zip(metrics.SERVICE_LABELS, key, strict=True))
    values = []
    slo_gauges = (
        metrics.SLO_P99_SECONDS,
        metrics.OBSERVED_P99_SECONDS,
        metrics.BUDGET_WINDOW_P99_SECONDS,
    )
    for gauge in slo_gauges:
        name = gauge.describe()[0].name
        values.append(REGISTRY.get_sample_value(name, {**labels, "slo": slo}))
    for gauge in (metrics.BATCH_SIZE, metrics.REPLICAS):
        values.append(REGISTRY.get_sample_value(gauge.describe()[0].name, labels))
    return values


class StopsAfterOneTick:
    """Kopf's DaemonStopped as the loop uses it: false, then true once the loop has waited."""

    def __init__(self) -> None:
        self.stopped = False

    def __bool__(self) -> bool:
        return self.stopped

    async def wait(self, timeout: float) -> None:
        self.stopped = True


async def test_service_gauges_follow_each_tick_and_go_with_the_service():
    key = ("team-a", "chat")
    slos = {"ttft": (5.0, 7.5, 5.5), "tpot": (0.1, 0.05, 0.06), "e2e": (None, 30.0, None)}
    metrics.export_service(key, slos=slos, batch=16, replicas=2)
    assert service_gauges(key) == [5.0, 7.5, 5.5, 16, 2]
    assert service_gauges(key, "tpot") == [0.1, 0.05, 0.06, 16, 2]
    assert service_gauges(key, "e2e") == [None, 30.0, None, 16, 2]  # no E2E SLO set

    metrics.export_service(key, slos={**slos, "ttft": (5.0, math.nan, None)}, batch=12, replicas=3)
    assert service_gauges(key) == [5.0, None, None, 12, 3]

    # The service is deleted: its daemon ends (here after one tick that finds nothing to do).
    await handlers.control_loop(
        stopped=StopsAfterOneTick(),
        name="chat",
        namespace="team-a",
        spec={},
        body={},
        memo=SimpleNamespace(wok=None),
        logger=None,
        runtime_pods={},
        runtime_replicas={},
    )
    assert service_gauges(key) == [None] * 5
    assert service_gauges(key, "tpot") == [None] * 5
