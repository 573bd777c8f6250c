"""bench/gpu/gpu_check.py cannot rot: its --device cpu --quick mode runs the same code path as on a
GPU (greedy equality with transformers, engine_vs_hf's workloads, the KV pool against the
operator's budget, load times) end to end on builtin:tiny, in seconds."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "gpu_check.py"


def test_the_quick_cpu_mode_runs_every_part_and_writes_the_report(tmp_path: Path) -> None:
    argv = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(tmp_path)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "--quick" in report["command"]
    assert report["machine"]["device"] == "cpu" and report["machine"]["torch"]
    (part,) = report["models"]
    assert part["model"] == "builtin:tiny"
    # The CPU runs its own attention, and captures no graph; vLLM and the profile need CUDA.
    assert part["runner"]["decode_graph_sizes"] == [] and part["runner"]["paged_kernel"] is None
    assert report["serve"] == report["profile"] == {"skipped": "CUDA only"}
    # (a) fp32 on one CPU: wok's greedy tokens are HF's, exactly.
    eq = part["equality"]
    assert eq["identical"] == eq["prompts"] == 4 and "first_divergence" not in eq
    # (b) engine_vs_hf's workloads, each with its baseline.
    throughput = part["throughput"]
    for key in ("a_mixed_lengths", "b_equal_lengths"):
        modes = [row["mode"] for row in throughput[key]["rows"]]
        assert modes[0] == "wok-continuous" and modes[1].startswith("hf-generate-static")
        assert throughput[key]["speedup_vs_hf_static"] > 0
    trace = throughput["c_azure_code_trace"]
    assert "skipped" in trace or trace["speedup_continuous_vs_serial"] > 0
    # (c) the pool is the operator's budget in whole blocks, and `wok budget` says the same.
    kv = part["kv_pool"]
    budget = kv["operator_budget_bytes"]
    assert kv["runtime_pool_bytes"] <= budget and kv["runtime_measured_bytes"] > 0
    wok = [sys.executable, "-c", "import sys; from wok.cli import main; sys.exit(main())"]
    command = shlex.split(kv["wok_budget_command"])
    assert command[:2] == ["wok", "budget"]
    printed = subprocess.run(
        [*wok, *command[1:], "--json"], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(printed.stdout)["kv_budget_bytes"] == budget
    # (d) load times; no GPU figures on the CPU.
    assert part["memory"]["wok_load_s"] > 0 and part["memory"]["hf_load_s"] > 0
    assert not any(key.endswith("_bytes") for key in part["memory"])
    text = (tmp_path / "gpu_check.md").read_text()
    for heading in ("(a) Greedy equality", "(b) a_mixed_lengths", "(c) The KV pool", "(d) Load"):
        assert heading in text


def test_the_dry_run_checks_the_gpu_script_without_a_gpu(tmp_path: Path) -> None:
    argv = [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "dry-run: ok" in run.stdout
    checks = json.loads((tmp_path / "gpu_check_dry.json").read_text())
    assert checks["graph_sizes"][-1] == 64
    assert "--cuda-graphs" in checks["commands"]["wok"]
    assert "--kv-cache-memory-bytes" in checks["commands"]["vllm"]
    # The 8B shape's weights fit an 80 GiB GPU with room for a pool.
    assert checks["budgets_80gi"]["8b"]["kv_budget_bytes"] > 40 << 30
    assert "(e) wok against vLLM" in (tmp_path / "gpu_check_dry.md").read_text()
