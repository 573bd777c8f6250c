"""`wok batch run` as a user runs it (a subprocess) against a live `wok runtime serve`
(builtin:tiny on 127.0.0.1): completion, kill -9 and resume, refused input, 4xx and 429s."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from runtime_harness import RuntimeServer, free_port, start_server

from wok_batch.batch_file import parse_batch_lines
from wok_batch.client import ClientSettings, send_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("batch"))
    yield srv
    assert srv.stop() == 0, srv.log()


def request_line(custom_id: str, *, max_tokens: int = 16, **body: Any) -> dict[str, Any]:
    """Even ids go to chat, odd ones to completions, so both endpoints are exercised."""
    if int(custom_id.rsplit("-", 1)[1]) % 2:
        url, prompt = "/v1/completions", {"prompt": f"{custom_id} once upon a time"}
    else:
        url, prompt = "/v1/chat/completions", {"messages": [{"role": "user", "content": custom_id}]}
    body = {**prompt, "max_tokens": max_tokens, "ignore_eos": True, **body}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def write_input(path: Path, records: list[dict[str, Any]]) -> list[str]:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return [record["custom_id"] for record in records]


def batch_argv(input_path: Path, output_path: Path, url: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "wok.cli", "batch", "run", "--input", str(input_path),
        "--output", str(output_path), "--url", url, "--json", *extra,
    ]  # fmt: skip


def run_batch(
    input_path: Path, output_path: Path, url: str, *extra: str
) -> tuple[int, dict[str, Any] | None, str]:
    """Exit code, the JSON summary (None if it printed none) and stderr."""
    done = subprocess.run(
        batch_argv(input_path, output_path, url, *extra),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    summary = json.loads(done.stdout) if done.stdout.strip() else None
    return done.returncode, summary, done.stderr


def results(output_path: Path) -> dict[str, dict[str, Any]]:
    """The result lines by custom_id; fails if any id has more than one."""
    records = [json.loads(text) for text in output_path.read_text().splitlines()]
    counts = Counter(record["custom_id"] for record in records)
    assert max(counts.values(), default=1) == 1, [i for i, n in counts.items() if n > 1]
    return {record["custom_id"]: record for record in records}


def successes(server: RuntimeServer) -> float:
    metrics = server.metrics()
    return sum(v for k, v in metrics.items() if k.startswith("vllm:request_success_total"))


def test_a_40_line_file_completes_each_id_once_with_200(server: RuntimeServer, tmp_path: Path):
    ids = write_input(tmp_path / "in.jsonl", [request_line(f"r-{i}") for i in range(40)])
    code, summary, stderr = run_batch(tmp_path / "in.jsonl", tmp_path / "out.jsonl", server.url)
    assert code == 0, stderr
    answered = results(tmp_path / "out.jsonl")
    assert set(answered) == set(ids)
    for record in answered.values():
        assert record["error"] is None and record["response"]["status_code"] == 200
        assert record["response"]["request_id"] == record["response"]["body"]["id"]
        assert record["response"]["body"]["usage"]["completion_tokens"] == 16
    assert summary is not None
    assert (summary["done"], summary["rejected"], summary["failed"]) == (40, 0, 0)
    assert summary["skipped"] == 0
    assert summary["completion_tokens"] == 40 * 16
    # A rerun finds everything answered and sends nothing.
    before = successes(server)
    code, summary, stderr = run_batch(tmp_path / "in.jsonl", tmp_path / "out.jsonl", server.url)
    assert code == 0, stderr
    assert summary is not None and (summary["skipped"], summary["done"]) == (40, 0)
    assert successes(server) == before
    assert len(results(tmp_path / "out.jsonl")) == 40


def test_kill_9_mid_file_then_a_rerun_answers_every_id_exactly_once(
    server: RuntimeServer, tmp_path: Path
):
    # Long answers one or two at a time: the file takes many seconds, so the kill lands mid-way.
    records = [request_line(f"k-{i}", max_tokens=100) for i in range(30)]
    ids = write_input(tmp_path / "in.jsonl", records)
    output = tmp_path / "out.jsonl"
    argv = batch_argv(tmp_path / "in.jsonl", output, server.url, "--max-concurrency", "2")
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (output.exists() and output.read_text().count("\n") >= 3):
        assert run.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no results within 60 s"
        time.sleep(0.05)
    run.kill()
    run.wait(10)
    before_rerun = len(results(output))
    assert 3 <= before_rerun < len(ids)

    code, summary, stderr = run_batch(tmp_path / "in.jsonl", output, server.url)
    assert code == 0, stderr
    answered = results(output)
    assert set(answered) == set(ids)
    assert all(r["response"]["status_code"] == 200 for r in answered.values())
    assert summary is not None
    assert (summary["skipped"], summary["done"]) == (before_rerun, len(ids) - before_rerun)


def test_a_malformed_line_exits_2_and_nothing_is_sent(server: RuntimeServer, tmp_path: Path):
    input_path = tmp_path / "in.jsonl"
    write_input(input_path, [request_line(f"m-{i}") for i in range(5)])
    with input_path.open("a") as file:
        file.write('{"custom_id": "m-5", "method": "POST"\n')
    before = successes(server)
    code, summary, stderr = run_batch(input_path, tmp_path / "out.jsonl", server.url)
    assert code == 2
    assert summary is None
    assert f"{input_path}:6: not valid JSON" in stderr
    assert not (tmp_path / "out.jsonl").exists()
    assert successes(server) == before


def test_a_4xx_is_recorded_with_its_status_and_not_retried(server: RuntimeServer, tmp_path: Path):
    records = [
        request_line("e-1"),
        request_line("e-2", max_tokens=1000),  # beyond --max-model-len 256
        request_line("e-3", priority="no-such-class"),
    ]
    write_input(tmp_path / "in.jsonl", records)
    code, summary, stderr = run_batch(tmp_path / "in.jsonl", tmp_path / "out.jsonl", server.url)
    assert code == 1, stderr
    answered = results(tmp_path / "out.jsonl")
    assert answered["e-1"]["response"]["status_code"] == 200
    for custom_id, param in (("e-2", "max_tokens"), ("e-3", "priority")):
        response = answered[custom_id]["response"]
        assert response["status_code"] == 400 and answered[custom_id]["error"] is None
        assert response["body"]["error"]["param"] == param
    assert answered["e-2"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert summary is not None
    assert (summary["done"], summary["rejected"], summary["failed"]) == (1, 2, 0)
    assert summary["retried"] == 0
    # A 400 for the line's own body is final: a rerun sends nothing, counts it, and exits 1.
    before = successes(server)
    code, summary, stderr = run_batch(tmp_path / "in.jsonl", tmp_path / "out.jsonl", server.url)
    assert code == 1, stderr
    assert summary is not None
    assert (summary["skipped"], summary["done"], summary["rejected"]) == (3, 0, 2)
    assert successes(server) == before and len(results(tmp_path / "out.jsonl")) == 3


def test_a_rerun_retries_lines_a_wrong_url_failed_and_v1_in_the_url_is_accepted(
    server: RuntimeServer, tmp_path: Path
):
    ids = write_input(tmp_path / "in.jsonl", [request_line(f"u-{i}") for i in range(4)])
    output = tmp_path / "out.jsonl"
    # A URL that points past the service: every line is answered 404, which says nothing of
    # the lines themselves.
    code, summary, stderr = run_batch(tmp_path / "in.jsonl", output, f"{server.url}/nowhere")
    assert code == 1, stderr
    assert summary is not None and (summary["failed"], summary["rejected"]) == (4, 0)
    assert {r["response"]["status_code"] for r in results(output).values()} == {404}
    # The rerun, with the URL as an OpenAI client library spells it, answers each line once.
    code, summary, stderr = run_batch(tmp_path / "in.jsonl", output, f"{server.url}/v1/")
    assert code == 0, stderr
    assert summary is not None and (summary["done"], summary["skipped"]) == (4, 0)
    answered = results(output)
    assert set(answered) == set(ids)
    assert all(r["response"]["status_code"] == 200 for r in answered.values())


def test_priority_batch_is_sent_and_accepted(server: RuntimeServer, tmp_path: Path):
    # The runtime knows "batch" as a priority class, and as the batch lane where it has one.
    ids = write_input(tmp_path / "in.jsonl", [request_line(f"p-{i}") for i in range(4)])
    code, summary, stderr = run_batch(
        tmp_path / "in.jsonl", tmp_path / "out.jsonl", server.url, "--priority", "batch"
    )
    assert code == 0, stderr
    answered = results(tmp_path / "out.jsonl")
    assert set(answered) == set(ids)
    assert all(r["response"]["status_code"] == 200 for r in answered.values())
    assert summary is not None and summary["done"] == len(ids)


def test_429s_are_waited_out_and_every_line_ends_200(tmp_path: Path):
    # Room for 2 running and 2 queued: 16 senders overflow it at once.
    server = start_server(tmp_path, "--max-batch-size", "2", "--max-queue", "2")
    try:
        ids = write_input(
            tmp_path / "in.jsonl", [request_line(f"t-{i}", max_tokens=32) for i in range(24)]
        )
        code, summary, stderr = run_batch(
            tmp_path / "in.jsonl",
            tmp_path / "out.jsonl",
            server.url,
            "--max-concurrency",
            "16",
        )
        assert code == 0, stderr
        answered = results(tmp_path / "out.jsonl")
        assert set(answered) == set(ids)
        assert all(r["response"]["status_code"] == 200 for r in answered.values())
        assert summary is not None and summary["done"] == len(ids)
        rejected = server.metrics()[
            'wok_rejected_requests_total{model_name="builtin:tiny",reason="queue_full"}'
        ]
        assert summary["throttled"] == rejected > 0
    finally:
        assert server.stop() == 0, server.log()


def test_a_refused_connection_is_retried_then_written_as_an_error():
    # Nothing listens on the port: every attempt is refused, so the line ends with an error.
    [request] = parse_batch_lines([json.dumps(request_line("c-1"))])
    settings = ClientSettings(
        url=f"http://127.0.0.1:{free_port()}", max_attempts=3, backoff_base_s=0.01
    )
    written: list[dict[str, Any]] = []
    stats = asyncio.run(send_all([request], settings, on_result=written.append))
    [record] = written
    assert record["response"] is None
    assert record["error"]["code"] == "connection_error"
    assert "after 3 attempts" in record["error"]["message"]
    assert (stats.retried, stats.throttled) == (2, 0)
