"""The Grafana dashboard (charts/wok/files/dashboard.json): every panel queries series that are
exported, through template variables it defines (e2e/test_chart.py renders it with Helm)."""

import json
import re
from pathlib import Path

from test_alerts import operator_series
from test_metric_contract import EXPORTED, named_series

ROOT = Path(__file__).parents[2]
CHART = ROOT / "charts/wok"
DASHBOARD = CHART / "files/dashboard.json"
DATASOURCE = "${datasource}"
# Grafana's own variables; the dashboard's are in its templating list.
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    """The panels that query (rows only group them)."""
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def variables() -> list[dict]:
    return dashboard()["templating"]["list"]


def referenced_variables(thing: object) -> set[str]:
    """The variables `$name`, `${name}` and `${name:format}` anywhere in `thing`."""
    return set(re.findall(r"\$\{?(\w+)", json.dumps(thing)))


def test_every_panel_has_a_title_unit_description_datasource_and_a_query():
    assert dashboard()["schemaVersion"] >= 39
    assert panels()
    for panel in panels():
        title = panel.get("title")
        assert title, panel["id"]
        assert panel.get("description") and panel["fieldConfig"]["defaults"].get("unit"), title
        assert panel["datasource"]["uid"] == DATASOURCE, title
        assert panel["targets"], title
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE and target["expr"], title
    ids = [panel["id"] for panel in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_every_query_reads_exported_series():
    exported = EXPORTED | operator_series()
    queries = [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]
    queries += [(v["name"], v["query"]) for v in variables() if v["type"] == "query"]
    for where, promql in queries:
        named = named_series(promql)
        assert named, where
        assert named <= exported, f"{where}: {named - exported} exported by no one"
        # Grafana's window: at least four scrapes, whatever the zoom.
        assert promql.count("rate(") == promql.count("[$__rate_interval])"), where


def test_every_variable_a_panel_uses_is_defined():
    defined = {variable["name"] for variable in variables()} | GRAFANA_VARIABLES
    datasource = next(v for v in variables() if v["name"] == "datasource")
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    for panel in dashboard()["panels"]:
        assert referenced_variables(panel) <= defined, panel["title"]
    for variable in variables():
        assert referenced_variables(variable) <= defined, variable["name"]
