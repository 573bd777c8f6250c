"""`wok runtime serve --tensor-parallel-size 2` on the CPU: two processes over gloo answer what
one process answers, and the worker rank ends with the server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from runtime_harness import start_server

pytestmark = pytest.mark.integration

PROMPTS = ["Fry every order at once.", "The wok is hot", "ünïcødé 漢字 and a longer prompt " * 4]


def spawned_ranks(pid: int) -> list[int]:
    """Child processes of `pid` that multiprocessing spawned (not its resource tracker)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return [c for c in found if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def greedy_texts(url: str) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
    return texts


def test_two_ranks_serve_what_one_serves(tmp_path: Path):
    one = start_server(tmp_path, "--device", "cpu")
    try:
        want = greedy_texts(one.url)
    finally:
        assert one.stop() == 0, one.log()
    two = start_server(tmp_path, "--device", "cpu", "--tensor-parallel-size", "2")
    try:
        workers = spawned_ranks(two.proc.pid)
        assert len(workers) == 1, "rank 1 is a child process of the server"
        assert greedy_texts(two.url) == want
    finally:
        assert two.stop() == 0, two.log()
    for pid in workers:
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
