"""examples/batch-job.yaml: its command line is one the real `wok batch run` parser accepts, and
it points at the Service the operator renders for the example InferenceService."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from wok.cli import build_parser
from wok_batch import cli as batch_cli
from wok_operator.resources import desired_service

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def documents() -> dict[str, dict[str, Any]]:
    text = (EXAMPLES / "batch-job.yaml").read_text()
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text)}


def test_the_jobs_command_parses_as_wok_batch_run_against_the_operators_service():
    job = documents()["Job"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "wok"
    args = build_parser().parse_args(container["command"][1:] + container["args"])
    assert args.func is batch_cli.run
    service_name = yaml.safe_load((EXAMPLES / "minimal.yaml").read_text())["metadata"]["name"]
    service = desired_service(service_name, "default")
    [port] = service["spec"]["ports"]
    assert port["port"] == 80  # so the URL needs no port
    assert args.url == f"http://{service['metadata']['name']}"
    [mount] = container["volumeMounts"]
    assert args.input.parent == args.output.parent == Path(mount["mountPath"])


def test_a_killed_pod_is_replaced_and_resumes_from_the_claim():
    docs = documents()
    spec = docs["Job"]["spec"]
    assert spec["backoffLimit"] >= 1 and spec["parallelism"] == 1
    [volume] = spec["template"]["spec"]["volumes"]
    assert (
        volume["persistentVolumeClaim"]["claimName"]
        == docs["PersistentVolumeClaim"]["metadata"]["name"]
    )
