"""How the operator renders a runtime pod's device: a pod with GPUs runs `--device=cuda` (the
runtime then refuses to start without CUDA), a `sim:` source the simulated accelerator."""

from __future__ import annotations

from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import plan_for_spec
from wok_operator.resources import desired_deployment, runtime_args


def spec(**sections: object) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(sections)


def test_a_gpu_pod_runs_on_cuda_with_the_budgets_kv_pool():
    gpu = spec(runtime={"gpusPerPod": 1, "gpuMemory": "24Gi"}, model={"source": "builtin:tiny"})
    plan = plan_for_spec(gpu)
    deployment = desired_deployment("svc", "ns", gpu, budget=plan, replicas=1)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args.count("--device=cuda") == 1
    assert f"--kv-cache-bytes={plan.kv_budget_bytes}" in args
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_a_sim_pod_names_no_cuda():
    sim = spec(model={"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b"})
    args = runtime_args(sim, plan_for_spec(sim))
    assert "--device=sim" in args
    assert not any(a.startswith("--device=cuda") for a in args)
