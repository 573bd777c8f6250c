"""Property-based fuzzing of the live server against its own OpenAPI schema (schemathesis):
hundreds of generated requests, valid and invalid, and not one 5xx. The server runs with a
short max_model_len so every generated request is cheap."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from runtime_harness import ADMIN_TOKEN, start_server
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # CPU-bound fuzzing: alone

# (path, method, examples per generation mode); ≥ 500 cases in all, under ~2 minutes.
OPERATIONS = [
    ("/v1/completions", "POST", 160),
    ("/v1/chat/completions", "POST", 80),
    ("/admin/v1/batching", "PUT", 40),
    ("/admin/v1/batching", "GET", 5),
    ("/v1/models", "GET", 5),
    ("/healthz", "GET", 5),
    ("/readyz", "GET", 5),
    ("/metrics", "GET", 5),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("fuzz"), "--max-model-len", "48")
    yield srv
    assert srv.stop() == 0, srv.log()


def test_no_generated_request_gets_a_5xx(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    calls: dict[int, int] = {}
    started = time.monotonic()
    for path, method, examples in OPERATIONS:
        operation = schema[path][method]
        # Operations without parameters have no invalid inputs to generate.
        modes = [GenerationMode.POSITIVE] + (
            [GenerationMode.NEGATIVE] if method == "PUT" or method == "POST" else []
        )
        for mode in modes:
            op_started, op_calls = time.monotonic(), sum(calls.values())

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def run(case) -> None:
                # Half the admin calls authenticated, so the validation behind the 401 is hit.
                headers = (
                    {"Authorization": f"Bearer {ADMIN_TOKEN}"} if sum(calls.values()) % 2 else {}
                )
                response = case.call(base_url=server.url, headers=headers, timeout=60)
                calls[response.status_code] = calls.get(response.status_code, 0) + 1
                case.validate_response(response, checks=[not_a_server_error])

            run()
            print(
                f"{method} {path} {mode.value}: {sum(calls.values()) - op_calls} cases "
                f"in {time.monotonic() - op_started:.1f} s"
            )
    total = sum(calls.values())
    print(
        f"{total} cases in {time.monotonic() - started:.1f} s, by status: {sorted(calls.items())}"
    )
    assert server.proc.poll() is None, server.log()
    assert total >= 500, calls
    assert not [status for status in calls if status >= 500]
    assert calls.get(200, 0) > 50, calls  # the fuzzing reached the engine, not only the validator
