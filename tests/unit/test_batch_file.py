"""The batch input file's validation and the output file's crash recovery (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wok.cli import main
from wok_batch.batch_file import BatchFileError, parse_batch_lines, read_batch_file
from wok_batch.client import service_root
from wok_batch.results import (
    ResultWriter,
    keep_final,
    read_results,
    result_record,
    truncate_torn_tail,
)
from wok_batch.summary import Summary


def line(custom_id: str, url: str = "/v1/completions", **fields: object) -> str:
    record = {"custom_id": custom_id, "method": "POST", "url": url, "body": {"prompt": "hi"}}
    return json.dumps({**record, **fields})


def problems_of(*lines: str) -> list[tuple[int, str]]:
    with pytest.raises(BatchFileError) as caught:
        parse_batch_lines(lines)
    return caught.value.problems


# --- the input file --------------------------------------------------------------------------


def test_valid_lines_parse_in_order_and_blank_lines_are_skipped():
    requests = parse_batch_lines(
        [line("a"), "", line("b", "/v1/chat/completions", body={"messages": []}), "  \n"]
    )
    assert [(r.line_number, r.custom_id, r.url) for r in requests] == [
        (1, "a", "/v1/completions"),
        (3, "b", "/v1/chat/completions"),
    ]
    assert requests[1].body == {"messages": []}


def test_a_malformed_line_is_named_by_its_number():
    assert problems_of(line("a"), line("b"), '{"custom_id": "c", "method": ') == [
        (3, "not valid JSON (Expecting value, column 30)")
    ]


def test_a_duplicate_id_names_both_lines():
    assert problems_of(line("a"), line("b"), line("a")) == [
        (3, "duplicate custom_id 'a' (first on 1)")
    ]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (line("a", "/v1/embeddings"), "unknown url '/v1/embeddings'"),
        (line("a", method="GET"), "method must be POST, got 'GET'"),
        (json.dumps({"custom_id": "a", "body": {}}), "missing field(s): method, url"),
        (line("a", body="prompt"), "body must be a JSON object"),
        (line("a", body={"prompt": "x", "stream": True}), "body.stream must be false"),
        (line(""), "custom_id must be a non-empty string"),
        (
            json.dumps({"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {}}),
            "custom_id must be a non-empty string",
        ),
        ("[1, 2]", "a line must be a JSON object"),
    ],
)
def test_each_kind_of_bad_line_is_explained(bad: str, reason: str):
    [(line_number, problem)] = problems_of(line("ok"), bad)
    assert line_number == 2
    assert problem.startswith(reason)


def test_every_problem_is_reported_but_the_message_stays_short():
    with pytest.raises(BatchFileError) as caught:
        parse_batch_lines(["{"] * 25, source="in.jsonl")
    assert len(caught.value.problems) == 25
    message = str(caught.value)
    assert "in.jsonl:20: not valid JSON" in message and "in.jsonl:21:" not in message
    assert "… and 5 more problems" in message


def test_non_utf8_bytes_are_a_numbered_problem(tmp_path: Path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(line("a").encode() + b"\n\xff\xfe\n")
    with pytest.raises(BatchFileError) as caught:
        read_batch_file(path)
    assert caught.value.problems == [(2, "not UTF-8 text")]


def test_validate_command_exits_2_naming_the_line(tmp_path: Path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(f"{line('a')}\nnot json\n")
    assert main(["batch", "validate", "--input", str(path)]) == 2
    assert f"{path}:2: not valid JSON" in capsys.readouterr().err
    path.write_text(f"{line('a')}\n{line('b')}\n")
    assert main(["batch", "validate", "--input", str(path)]) == 0
    assert "2 requests, valid" in capsys.readouterr().out


# --- the output file -------------------------------------------------------------------------


def write_results(path: Path, *custom_ids: str) -> None:
    with ResultWriter(path) as writer:
        for custom_id in custom_ids:
            writer.append(result_record(custom_id, error={"code": "x", "message": "y"}))


def ids_in(path: Path) -> set[str]:
    return {record["custom_id"] for record in read_results(path)}


def test_results_are_appended_as_whole_lines_across_runs(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    write_results(path, "a", "b")
    write_results(path, "c")
    records = [json.loads(text) for text in path.read_text().splitlines()]
    assert [r["custom_id"] for r in records] == ["a", "b", "c"]
    assert set(records[0]) == {"id", "custom_id", "response", "error"}
    assert records[0]["id"].startswith("batch_req_") and records[0]["id"] != records[1]["id"]
    assert ids_in(path) == {"a", "b", "c"}


def test_a_torn_tail_is_cut_back_to_the_last_whole_line(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    write_results(path, "a", "b")
    whole = path.read_bytes()
    torn = json.dumps(result_record("c")).encode()[:25]
    path.write_bytes(whole + torn)
    assert truncate_torn_tail(path) == len(torn)
    assert path.read_bytes() == whole
    assert ids_in(path) == {"a", "b"}
    assert truncate_torn_tail(path) == 0


def test_a_torn_tail_longer_than_one_read_and_a_file_of_only_a_torn_line(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    write_results(path, "a")
    whole = path.read_bytes()
    path.write_bytes(whole + b"x" * 200_000)
    assert truncate_torn_tail(path) == 200_000
    assert path.read_bytes() == whole
    path.write_bytes(b'{"custom_id": "a"')
    assert truncate_torn_tail(path) == 17
    assert path.read_bytes() == b""
    assert ids_in(path) == set()


def test_a_missing_output_file_means_nothing_answered(tmp_path: Path):
    path = tmp_path / "absent.jsonl"
    assert truncate_torn_tail(path) == 0
    assert ids_in(path) == set()
    assert not path.exists()


def test_an_output_file_that_is_not_ours_is_refused(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    write_results(path, "a")
    with path.open("a") as file:
        file.write("some notes\n")
    with pytest.raises(ValueError, match=r"out.jsonl:2: not a batch result line"):
        keep_final(path)


def answer(status: int, **body: object) -> dict[str, object]:
    return {"status_code": status, "request_id": "r", "body": body}


def test_a_rerun_drops_lines_that_failed_outside_the_line_and_keeps_the_rest(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    kept = {
        "ok": result_record("ok", response=answer(200)),
        "bad-body": result_record("bad-body", response=answer(400, error={})),
        "too-big": result_record("too-big", response=answer(413)),
        "no-such-model": result_record(
            "no-such-model", response=answer(404, error={"code": "model_not_found"})
        ),
    }
    dropped = [
        result_record("refused", error={"code": "connection_error", "message": "m"}),
        result_record("down", response=answer(503)),
        result_record("busy", response=answer(429)),
        result_record("wrong-url", response=answer(404)),
        result_record("wrong-method", response=answer(405)),
    ]
    with ResultWriter(path) as writer:
        for record in [*kept.values(), *dropped]:
            writer.append(record)
    answered, count = keep_final(path)
    assert (answered, count) == (kept, len(dropped))
    assert read_results(path) == list(kept.values())
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
    # Nothing left to drop: the file is not rewritten.
    before = path.stat().st_mtime_ns
    assert keep_final(path) == (kept, 0)
    assert path.stat().st_mtime_ns == before


def test_the_summary_counts_done_rejected_failed_and_the_exit_code():
    summary = Summary(total=5)
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    summary.add(result_record("a", response=answer(200, usage=usage)))
    summary.add(result_record("b", response=answer(400, error={})))
    summary.add(result_record("c", error={"code": "timeout", "message": "m"}))
    summary.add(result_record("d", response=answer(404)))
    summary.add_earlier(result_record("e", response=answer(400, error={})))
    summary.elapsed_s = 2.0
    assert (summary.done, summary.rejected, summary.failed, summary.skipped) == (1, 2, 2, 1)
    assert (summary.prompt_tokens, summary.completion_tokens) == (5, 7)
    assert summary.as_dict()["completion_tokens_per_s"] == 3.5
    assert summary.text().startswith("5 requests: 1 done, 1 skipped (answered by an earlier run)")
    assert summary.exit_code == 1


def test_only_2xx_lines_exit_0():
    summary = Summary(total=2)
    summary.add(result_record("a", response=answer(200)))
    summary.add_earlier(result_record("b", response=answer(201)))
    assert (summary.done, summary.skipped, summary.exit_code) == (1, 1, 0)


@pytest.mark.parametrize(
    "url",
    ["http://svc", "http://svc/", "http://svc/v1", "http://svc/v1/"],
)
def test_the_url_is_the_same_with_or_without_v1(url: str):
    assert service_root(url) == "http://svc"


def test_a_path_prefix_before_v1_is_kept():
    assert service_root("https://gw.example/llm/v1") == "https://gw.example/llm"
