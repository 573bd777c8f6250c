"""The fake vLLM pod's command line (cluster/wok_cluster/vllm_sim.py): the operator's rendered
`vllm serve` arguments become `wok runtime serve --device sim --as-vllm` with the same settings,
and the backed pod runs it only under the harness option (the process itself:
tests/integration/test_vllm_sim_pod.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from wok_cluster.backed_pod import BackedPod
from wok_cluster.vllm_process import SERVER_MODULE
from wok_cluster.vllm_sim import sim_vllm_argv
from wok_operator import api
from wok_operator.vllm_pod import vllm_args, vllm_container

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm-tiny.yaml"
NAME = "fake-vllm"


def example_spec(**queue: object) -> api.InferenceServiceSpec:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec["queue"] = {**spec["queue"], **queue}
    return api.InferenceServiceSpec.model_validate(spec)


def test_the_operators_vllm_flags_map_onto_the_runtime_flag_for_flag():
    args = vllm_args(example_spec(maxLength=64), max_num_seqs=32, served_name=NAME)
    argv = sim_vllm_argv(["vllm", "serve"], args, pod_ip="127.9.0.4", profile="sim:p")
    assert argv[:3] == ["wok", "runtime", "serve"]
    expected = {
        "--device=sim",
        "--as-vllm",
        "--queue-timeout=inf",  # vLLM has no queue timeout
        "--profile=sim:p",
        "--host=127.9.0.4",
        "--port=8000",
        f"--served-model-name={NAME}",
        "--max-batch-size=32",
        "--max-queue=96",  # --max-num-queued-reqs: 32 running + 64 waiting, in flight
        "--max-num-batched-tokens=2048",
        "--max-model-len=512",
        "--drain-seconds=30",
    }
    assert set(argv[3:]) == expected


def test_prefix_caching_off_is_kept_and_flags_may_be_split():
    argv = sim_vllm_argv(
        ["vllm", "serve"],
        ["/models/x", "--max-num-seqs", "8", "--no-enable-prefix-caching"],
        pod_ip="i",
        profile="p",
    )
    assert "--max-batch-size=8" in argv
    assert "--no-prefix-caching" in argv
    assert "--max-queue=1073741824" in argv  # no --max-num-queued-reqs: vLLM has no bound


def rendered_pod() -> dict:
    container = vllm_container(
        example_spec(), max_num_seqs=32, served_name=NAME, resources={}, mounts=[]
    )
    return {
        "metadata": {"uid": "u1", "name": "p", "namespace": "n"},
        "spec": {"containers": [container]},
        "status": {"podIP": "127.9.0.4"},
    }


def test_the_backed_pod_runs_vllm_as_the_fake_only_under_the_harness_option(tmp_path, monkeypatch):
    pod = rendered_pod()
    faked = BackedPod(pod, tmp_path, vllm_sim_profile="sim:llama-3-8b-80g")
    launch = faked._launch(None, pod["spec"]["containers"][0], {})
    assert Path(launch.argv[0]).name == "wok"
    assert "--as-vllm" in launch.argv
    assert "--profile=sim:llama-3-8b-80g" in launch.argv
    assert "--host=127.9.0.4" in launch.argv
    # without it, vLLM's own server (its venv's python, here a stand-in path)
    monkeypatch.setattr(
        "wok_cluster.vllm_process.vllm_python", lambda venv=None: Path("/venv/bin/python")
    )
    real = BackedPod(pod, tmp_path)._launch(None, pod["spec"]["containers"][0], {})
    assert real.argv[:3] == ["/venv/bin/python", "-m", SERVER_MODULE]
