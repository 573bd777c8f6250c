"""The memory budget: exact figures for known models, and clear errors for impossible ones."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from wok_operator import budget
from wok_operator.api import InferenceServiceSpec

GIB = 2**30
ROOT = Path(__file__).resolve().parents[2]


def test_llama2_7b_kv_bytes_per_token_fp16():
    assert budget.kv_bytes_per_token(budget.preset("llama-2-7b"), "float16") == 524_288


def test_llama3_8b_kv_bytes_per_token_is_gqa_aware():
    assert budget.kv_bytes_per_token(budget.preset("llama-3-8b"), "float16") == 131_072


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama-2-7b", 6.738),
        ("llama-3-8b", 8.030),
        ("smollm2-135m", 0.1345),
        ("llama-3-70b", 70.55),
        # Published sizes of the served families (tied embeddings counted once).
        ("llama-3.1-8b", 8.030),
        ("llama-3.2-1b", 1.236),
        ("llama-3.2-3b", 3.213),
        ("llama-3.3-70b", 70.55),
        ("mistral-7b-v0.3", 7.248),
        ("qwen2.5-0.5b", 0.494),
        ("qwen2.5-7b", 7.616),
        ("qwen3-0.6b", 0.596),
        ("qwen3-8b", 8.191),
    ],
)
def test_parameter_counts_match_the_published_models(name, billions):
    assert budget.parameter_count(budget.preset(name)) / 1e9 == pytest.approx(billions, rel=2e-3)


def test_llama2_7b_on_80gi_fits_29_full_length_sequences():
    plan = budget.plan_memory(
        budget.preset("llama-2-7b"),
        gpu_memory_bytes=80 * GIB,
        utilization=0.9,
        max_model_len=4096,
        dtype="float16",
    )
    assert plan.weights_bytes == 6_738_415_616 * 2
    expected_kv = int(80 * GIB * 0.9) - plan.weights_bytes - plan.activation_bytes - 512 * 2**20
    assert plan.kv_budget_bytes == expected_kv
    assert plan.max_batch_size == expected_kv // (524_288 * 4096) == 29
    assert 0 <= plan.free_bytes < 524_288 * 4096


def test_shorter_observed_sequences_fit_more():
    arch = budget.preset("llama-3-8b")
    full = budget.plan_memory(arch, gpu_memory_bytes=80 * GIB, max_model_len=8192)
    mean = budget.plan_memory(
        arch, gpu_memory_bytes=80 * GIB, max_model_len=8192, sequence_length=1024
    )
    assert mean.max_batch_size == full.kv_budget_bytes // (131_072 * 1024)
    assert mean.max_batch_size >= 8 * full.max_batch_size


def test_more_gpus_more_batch():
    arch = budget.preset("llama-3-70b")
    with pytest.raises(ValueError, match="does not fit"):
        budget.plan_memory(arch, gpu_memory_bytes=80 * GIB)
    assert budget.plan_memory(arch, gpu_memory_bytes=80 * GIB, gpus=4).max_batch_size > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_memory_bytes": -1}, "positive"),
        ({"gpu_memory_bytes": GIB, "utilization": 1.5}, "utilization"),
        ({"gpu_memory_bytes": GIB, "utilization": 0}, "utilization"),
        ({"gpu_memory_bytes": GIB, "dtype": "int3"}, "unknown dtype"),
        ({"gpu_memory_bytes": GIB, "gpus": 0}, "at least 1"),
        ({"gpu_memory_bytes": 8 * GIB}, "does not fit"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        budget.plan_memory(budget.preset("llama-2-7b"), **kwargs)


def test_hf_config_round_trip(tmp_path):
    arch = budget.preset("llama-3-8b")
    config = {**arch.model_dump(exclude={"head_dim"}), "model_type": "llama", "rope_theta": 5e5}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert budget.architecture_from_hf_config(path) == arch
    del config["vocab_size"]
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks vocab_size"):
        budget.architecture_from_hf_config(path)


def test_an_hf_config_of_a_family_the_runtime_cannot_serve_is_refused(tmp_path):
    config = {**budget.preset("llama-3-8b").model_dump(exclude={"head_dim"}), "model_type": "gemma"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model_type 'gemma' is not served by the runtime"):
        budget.architecture_from_hf_config(path)
    config["model_type"] = "qwen3"
    path.write_text(json.dumps(config))
    assert budget.architecture_from_hf_config(path).model_type == "qwen3"


def test_plan_for_spec_uses_the_builtin_preset():
    spec = InferenceServiceSpec.model_validate({"runtime": {"gpuMemory": "1Gi"}})
    plan = budget.plan_for_spec(spec)
    assert plan.kv_bytes_per_token == 2 * 4 * 4 * 32 * 2
    assert plan.max_batch_size > 64


def wok(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wok.cli", *args], capture_output=True, text=True, check=False
    )


def test_cli_json_round_trips_the_plan():
    result = wok(
        "budget",
        "--preset",
        "llama-2-7b",
        "--gpu-memory",
        "80Gi",
        "--utilization",
        "0.9",
        "--max-model-len",
        "4096",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    plan = budget.plan_memory(
        budget.preset("llama-2-7b"), gpu_memory_bytes=80 * GIB, utilization=0.9, max_model_len=4096
    )
    assert json.loads(result.stdout) == plan.as_json()
    assert set(json.loads(result.stdout)) == {
        "weights_bytes",
        "activation_bytes",
        "reserve_bytes",
        "kv_bytes_per_token",
        "kv_budget_bytes",
        "max_batch_size",
    }


def test_cli_table_shows_the_memory_map():
    result = wok("budget", "--preset", "llama-3-8b")
    assert result.returncode == 0
    for label in ("weights", "activations", "KV cache", "reserve", "free", "max batch by memory"):
        assert label in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("--preset", "tiny", "--gpu-memory=-5Gi"),
        ("--preset", "tiny", "--utilization", "1.5"),
        ("--preset", "llama-2-7b", "--gpu-memory", "8Gi"),
        ("--preset", "nope"),
        ("--config", "/nonexistent/config.json"),
    ],
)
def test_cli_bad_input_exits_nonzero_with_one_line(args):
    result = wok("budget", *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("wok budget: error:")


def test_tensor_parallelism_budget_pod_and_cli_agree():
    """examples/llama-3-70b-tp4.yaml: the budget, the pod the operator renders and `wok budget
    --gpus 4` say the same, and each GPU's quarter fits its own memory."""
    from wok_operator.resources import desired_deployment

    document = yaml.safe_load((ROOT / "examples" / "llama-3-70b-tp4.yaml").read_text())
    spec = InferenceServiceSpec.model_validate(document["spec"])
    plan = budget.plan_for_spec(spec)
    split, replicated = budget.parameter_split(budget.preset("llama-3-70b"))
    assert plan.weights_bytes == (split + 4 * replicated) * 2  # embeddings, head on every GPU
    assert plan.reserve_bytes == 4 * 512 * 2**20
    per_gpu = (plan.weights_bytes + plan.activation_bytes + plan.reserve_bytes) // 4
    assert per_gpu + plan.kv_budget_bytes // 4 <= 80 * GIB * 0.9
    assert plan.max_batch_size == 49  # of 8192 tokens

    result = wok(
        "budget",
        *("--preset", "llama-3-70b", "--gpus", "4", "--gpu-memory", "80Gi", "--dtype", "bfloat16"),
        *("--max-model-len", "8192", "--max-num-batched-tokens", "8192", "--json"),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == plan.as_json()

    pod = desired_deployment("llama", "inference", spec, budget=plan, replicas=1)
    pod = pod["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["limits"]["memory"] == budget.mebibytes(
        plan.weights_bytes + 4 * budget.RUNTIME_OVERHEAD_BYTES
    )
    assert f"--kv-cache-bytes={plan.kv_budget_bytes}" in container["args"]
    assert "--tensor-parallel-size=4" in container["args"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_heads_that_do_not_split_over_the_gpus_are_refused():
    with pytest.raises(ValueError, match=r"numAttentionHeads \(32\) unevenly"):
        budget.plan_memory(budget.preset("llama-3-8b"), gpu_memory_bytes=80 * GIB, gpus=3)
    with pytest.raises(ValueError, match=r"numKeyValueHeads \(8\) unevenly"):
        budget.plan_memory(budget.preset("llama-3-8b"), gpu_memory_bytes=80 * GIB, gpus=16)
    one = budget.plan_memory(budget.preset("llama-3-8b"), gpu_memory_bytes=80 * GIB)
    two = budget.plan_memory(budget.preset("llama-3-8b"), gpu_memory_bytes=80 * GIB, gpus=2)
    assert two.max_batch_size > 2 * one.max_batch_size  # the weights are paid for once
