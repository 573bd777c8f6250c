"""How the operator renders a runtime pod's device and memory: a pod with GPUs runs
`--device=cuda` (the runtime then refuses to start without CUDA), a `sim:` source the simulated
accelerator; the memory request and limit come from the budget (the weights on the host while
they load + the runtime's overhead), not a fixed figure, unless the spec sets one."""

from __future__ import annotations

from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import (
    RUNTIME_OVERHEAD_BYTES,
    SIM_POD_MEMORY_BYTES,
    mebibytes,
    plan_for_spec,
)
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


def memory_of(service: InferenceServiceSpec) -> tuple[str, str]:
    deployment = desired_deployment("svc", "ns", service, budget=plan_for_spec(service), replicas=1)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["resources"]["requests"]["memory"], container["resources"]["limits"]["memory"]


def test_the_pod_memory_is_the_weights_plus_the_runtime_overhead():
    volume = {"claimName": "weights", "mountPath": "/models"}
    model = {"source": "/models/llama", "preset": "llama-3-8b", "dtype": "bfloat16"}
    llama = spec(model=model | {"volume": volume})
    weights = plan_for_spec(llama).weights_bytes
    assert 14 * 2**30 < weights < 15 * 2**30  # 8.03 B parameters in bfloat16: 14.96 GiB
    expected = mebibytes(weights + RUNTIME_OVERHEAD_BYTES)
    assert memory_of(llama) == (expected, expected)
    assert expected != "8192Mi"
    tiny = spec(model={"source": "builtin:tiny", "dtype": "float32"})
    assert memory_of(tiny) == (mebibytes(plan_for_spec(tiny).weights_bytes + 2 * 2**30),) * 2


def test_a_sim_pod_needs_little_memory_and_an_explicit_figure_wins():
    sim = spec(model={"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b"})
    assert memory_of(sim) == (mebibytes(SIM_POD_MEMORY_BYTES),) * 2
    pinned = spec(model={"source": "builtin:tiny"}, runtime={"memory": "1Gi"})
    assert memory_of(pinned) == ("1024Mi", "1024Mi")


def test_mebibytes_rounds_up():
    assert mebibytes(2**20) == "1Mi"
    assert mebibytes(2**20 + 1) == "2Mi"
