"""A fake vLLM pod: a vLLM container run as wok's runtime on the simulated accelerator.

Why: vLLM's CPU build shares the host's cores (two pods serve 1.26x one), so a fleet of real
vLLM pods cannot scale on the emulated cluster. With the harness option `vllm_sim_profile`
(`Cluster(vllm_sim_profile=…)`, `wok dev backer --vllm-sim-profile`), every container that runs
vLLM (vllm_process.is_vllm) becomes `wok runtime serve --device sim --as-vllm` instead: the
profile's step times, and vLLM's surface where wok's runtime differs (only vLLM's metric series,
`/health`, 503 past the queue bound, no admin API). The pod, its probes and its arguments stay
what the operator rendered; the arguments are mapped here, flag for flag:

  --max-num-seqs            -> --max-batch-size (fixed: vLLM reads it once, nothing changes it)
  --max-num-batched-tokens  -> --max-num-batched-tokens
  --max-num-queued-reqs     -> --max-queue (with --as-vllm the runtime bounds the requests in
                               flight, waiting and running, as vLLM does)
  --max-model-len, --served-model-name, --port, --host (the pod's IP), prefix caching
  --shutdown-timeout        -> --drain-seconds
and vLLM has no queue timeout (--queue-timeout inf). The rest (the model path, dtype, GPU memory
utilization, tensor parallelism) has no meaning on the simulated accelerator, whose profile sets
the model, the KV pool and the load time.

What this fake does not do: the simulator's vLLM pod (sim/wok_sim/vllm_pod.py) also holds each
request for the profile's `request_overhead_s` in a serial API-server front; the builtin analytic
profiles have none (0 s), so on them the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence

UNBOUNDED = 1 << 30  # vLLM's default: no --max-num-queued-reqs, no bound
SIM_FLAGS = ("--device=sim", "--as-vllm", "--queue-timeout=inf")


def _flags(words: Sequence[str]) -> dict[str, str]:
    """`--flag=value`, `--flag value` and bare `--flag` (as "") into a dict; positionals dropped."""
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            continue
        name, sep, value = word.partition("=")
        if not sep and i < len(words) and not words[i].startswith("--"):
            value = words[i]
            i += 1
        out[name] = value
    return out


def sim_vllm_argv(
    command: Sequence[str], args: Sequence[str], *, pod_ip: str, profile: str
) -> list[str]:
    """The runtime's command line for a vLLM container's `command` + `args` (`vllm serve MODEL
    --flag=value …`, as operator/wok_operator/vllm_pod.py renders them)."""
    flags = _flags([*command, *args])
    # vLLM's defaults where a flag is absent
    mapped = {
        "--max-batch-size": flags.get("--max-num-seqs", "256"),
        "--max-num-batched-tokens": flags.get("--max-num-batched-tokens"),
        "--max-queue": flags.get("--max-num-queued-reqs", str(UNBOUNDED)),
        "--max-model-len": flags.get("--max-model-len"),
        "--served-model-name": flags.get("--served-model-name"),
        "--port": flags.get("--port", "8000"),
        "--drain-seconds": flags.get("--shutdown-timeout"),
    }
    argv = [
        "wok",  # this environment's (backed_pod.map_program)
        "runtime",
        "serve",
        *SIM_FLAGS,
        f"--profile={profile}",
        f"--host={pod_ip}",
        *(f"{name}={value}" for name, value in mapped.items() if value is not None),
    ]
    if "--no-enable-prefix-caching" in flags:
        argv.append("--no-prefix-caching")
    return argv
