"""The per-pod memory budget: how many sequences fit in GPU memory, before a pod is ever started.

Pure arithmetic, no torch. The operator writes the result to status and never moves the batch size
past `max_batch_size` (the design's B_mem). Formulas:

    weights      = parameters(architecture) · dtype_bytes   (Qwen2's Q/K/V biases and Qwen3's
                   q/k norms included; over N GPUs, tensor parallelism splits the attention
                   and MLP projections and every GPU holds the embeddings, norms and LM head)
    kv/token     = 2 · layers · kv_heads · head_dim · dtype_bytes   (K and V; GQA-aware)
    activations  = N · (T · (4·hidden + 2·intermediate/N) · dtype_bytes  +  T · vocab · 4)
                   with T = max_num_batched_tokens: the residual stream, attention projections and
                   the SwiGLU gate/up pair of one step's tokens, plus fp32 logits for the sampler
                   (an upper bound: the runtime computes logits only for each sequence's last token)
    kv_budget    = N · (gpu_memory · utilization − reserve) − weights − activations
    B_mem        = floor(kv_budget / (kv/token · L)),  L = max_model_len or the observed mean length

and on the host, the pod's memory request and limit (`pod_memory_bytes`):

    pod memory   = weights + N · runtime overhead  (one process per GPU; a `sim:` pod:
                                                     SIM_POD_MEMORY_BYTES)

N = gpusPerPod. Every figure is the pod's, summed over its GPUs; each GPU holds 1/N of each, the
KV cache included (1/N of the KV heads), so B_mem is the same on every GPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from pydantic.alias_generators import to_camel

from wok_contracts.builtin_models import BUILTIN_SHAPES
from wok_operator.api import (
    Architecture,
    InferenceServiceSpec,
    MemorySpec,
    ModelType,
    quantity_bytes,
)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

#: Host memory of a runtime process besides the weights: the interpreter, torch, the host side
#: of the CUDA libraries and context, the tokenizer and the HTTP server. A builtin:tiny server
#: idles at about 0.6 GiB RSS on the CPU (torch's CUDA build); the CUDA context adds its host
#: side on a GPU node; the rest is headroom.
RUNTIME_OVERHEAD_BYTES = 2 * 2**30
#: A `sim:` pod: no torch and no weights (about 65 MB RSS idle,
#: bench/runtime/results/sim_device.md).
SIM_POD_MEMORY_BYTES = 256 * 2**20

PRESETS: dict[str, Architecture] = {
    # The built-in models' shapes, the runtime's own table (`builtin:NAME`).
    **{name: Architecture(**shape.memory_shape()) for name, shape in BUILTIN_SHAPES.items()},
    "llama-2-7b": Architecture(
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=11008,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "llama-2-13b": Architecture(
        num_hidden_layers=40,
        hidden_size=5120,
        intermediate_size=13824,
        num_attention_heads=40,
        num_key_value_heads=40,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "llama-3-8b": Architecture(
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
    ),
    "llama-3-70b": Architecture(
        num_hidden_layers=80,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
    ),
    "mistral-7b": Architecture(
        model_type="mistral",
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=32768,
    ),
    # The published configs' shapes (Hugging Face config.json).
    "llama-3.2-1b": Architecture(
        num_hidden_layers=16,
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
    "llama-3.2-3b": Architecture(
        num_hidden_layers=28,
        hidden_size=3072,
        intermediate_size=8192,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
    "qwen2.5-0.5b": Architecture(
        model_type="qwen2",
        num_hidden_layers=24,
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "qwen2.5-7b": Architecture(
        model_type="qwen2",
        num_hidden_layers=28,
        hidden_size=3584,
        intermediate_size=18944,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        max_position_embeddings=32768,
    ),
    "qwen3-0.6b": Architecture(
        model_type="qwen3",
        num_hidden_layers=28,
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    ),
    "qwen3-8b": Architecture(
        model_type="qwen3",
        num_hidden_layers=36,
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
    ),
}
# Llama 3.1 and 3.3 keep Llama 3's shapes (their llama3 RoPE scaling reaches 128K positions);
# Mistral 7B v0.3 grows v0.2's vocabulary.
for _name, _base, _change in (
    ("llama-3.1-8b", "llama-3-8b", {"max_position_embeddings": 131072}),
    ("llama-3.1-70b", "llama-3-70b", {"max_position_embeddings": 131072}),
    ("llama-3.3-70b", "llama-3-70b", {"max_position_embeddings": 131072}),
    ("mistral-7b-v0.3", "mistral-7b", {"vocab_size": 32768}),
):
    PRESETS[_name] = PRESETS[_base].model_copy(update=_change)

HF_CONFIG_KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class MemoryBudget:
    """The memory map of one pod: what the GPU holds, and the batch that fits beside it."""

    usable_bytes: int
    weights_bytes: int
    activation_bytes: int
    reserve_bytes: int
    kv_bytes_per_token: int
    kv_budget_bytes: int
    sequence_length: int
    max_batch_size: int

    @property
    def free_bytes(self) -> int:
        """What the KV budget leaves unused at `max_batch_size` full-length sequences."""
        used = self.max_batch_size * self.kv_bytes_per_token * self.sequence_length
        return self.kv_budget_bytes - used

    def as_json(self) -> dict[str, int]:
        return {
            "weights_bytes": self.weights_bytes,
            "activation_bytes": self.activation_bytes,
            "reserve_bytes": self.reserve_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_budget_bytes": self.kv_budget_bytes,
            "max_batch_size": self.max_batch_size,
        }


def parameter_split(arch: Architecture) -> tuple[int, int]:
    """(split, replicated): the parameters tensor parallelism splits over a pod's GPUs (the
    attention and MLP projections, Qwen2's biases) and those every GPU holds whole (embeddings,
    LM head, norms, Qwen3's q/k norms)."""
    head_dim = arch.resolved_head_dim
    q_dim = arch.num_attention_heads * head_dim
    kv_dim = arch.num_key_value_heads * head_dim
    attention = arch.hidden_size * (q_dim + 2 * kv_dim) + q_dim * arch.hidden_size
    if arch.model_type == "qwen2":
        attention += q_dim + 2 * kv_dim  # the Q/K/V biases
    mlp = 3 * arch.hidden_size * arch.intermediate_size
    norms = 2 * arch.hidden_size
    if arch.model_type == "qwen3":
        norms += 2 * head_dim  # q_norm, k_norm
    embeddings = arch.vocab_size * arch.hidden_size
    lm_head = 0 if arch.tie_word_embeddings else embeddings
    split = arch.num_hidden_layers * (attention + mlp)
    return split, arch.num_hidden_layers * norms + embeddings + arch.hidden_size + lm_head


def parameter_count(arch: Architecture) -> int:
    return sum(parameter_split(arch))


def check_split(arch: Architecture, gpus: int) -> None:
    """Tensor parallelism splits heads and MLP columns evenly (KV heads too: never copied)."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(arch, name)
        if value % gpus:
            raise ValueError(
                f"{gpus} GPUs per pod split {to_camel(name)} ({value}) unevenly: tensor "
                f"parallelism needs it to be a multiple of gpusPerPod"
            )


def kv_bytes_per_token(arch: Architecture, dtype: str) -> int:
    return (
        2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.resolved_head_dim
    ) * dtype_bytes(dtype)


def activation_bytes(
    arch: Architecture, dtype: str, max_num_batched_tokens: int, gpus: int = 1
) -> int:
    """The activation peak of one step, summed over the pod's GPUs (each holds the whole
    residual stream and logits, and 1/N of the MLP's intermediate)."""
    tokens = max_num_batched_tokens
    hidden_states = tokens * (4 * arch.hidden_size + 2 * arch.intermediate_size // gpus)
    return gpus * (hidden_states * dtype_bytes(dtype) + tokens * arch.vocab_size * 4)


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPE_BYTES)}") from None


def plan_memory(
    arch: Architecture,
    *,
    gpu_memory_bytes: int,
    gpus: int = 1,
    utilization: float = 0.9,
    dtype: str = "float16",
    max_model_len: int = 4096,
    reserve_bytes: int = 512 * 2**20,
    max_num_batched_tokens: int = 2048,
    sequence_length: int | None = None,
) -> MemoryBudget:
    """The memory map and B_mem; ValueError (one readable line) when the model cannot fit."""
    if gpu_memory_bytes <= 0:
        raise ValueError(f"GPU memory must be positive, got {gpu_memory_bytes} bytes")
    if gpus < 1:
        raise ValueError(f"GPUs per pod must be at least 1, got {gpus}")
    if not 0 < utilization <= 0.98:
        raise ValueError(f"utilization must be in (0, 0.98], got {utilization}")
    if max_model_len < 1 or max_num_batched_tokens < 1 or reserve_bytes < 0:
        raise ValueError("max model length and batched tokens must be positive, reserve >= 0")
    length = sequence_length if sequence_length is not None else max_model_len
    if length < 1:
        raise ValueError(f"sequence length must be positive, got {length}")
    check_split(arch, gpus)
    usable = math.floor(gpu_memory_bytes * gpus * utilization)
    split, replicated = parameter_split(arch)
    weights = (split + gpus * replicated) * dtype_bytes(dtype)
    activations = activation_bytes(arch, dtype, max_num_batched_tokens, gpus)
    reserve_bytes *= gpus  # one CUDA context per GPU
    kv_budget = usable - weights - activations - reserve_bytes
    per_token = kv_bytes_per_token(arch, dtype)
    if kv_budget < per_token * length:
        raise ValueError(
            f"the model does not fit: {gib(usable)} usable "
            f"({gpus} GPU × {gib(gpu_memory_bytes)} × {utilization}) − weights {gib(weights)} "
            f"− activations {gib(activations)} − reserve {gib(reserve_bytes)} leaves "
            f"{gib(max(kv_budget, 0))}, less than one {length}-token sequence "
            f"({gib(per_token * length)}): add GPUs or memory, or lower maxModelLen"
        )
    return MemoryBudget(
        usable_bytes=usable,
        weights_bytes=weights,
        activation_bytes=activations,
        reserve_bytes=reserve_bytes,
        kv_bytes_per_token=per_token,
        kv_budget_bytes=kv_budget,
        sequence_length=length,
        max_batch_size=kv_budget // (per_token * length),
    )


def pod_memory_bytes(spec: InferenceServiceSpec, budget: MemoryBudget) -> int:
    """The runtime pod's memory request and limit: `runtime.memory` when the spec sets it, else
    the weights on the host while they load plus the runtime's overhead, per process (one per
    GPU: tensor parallelism runs a rank on each). The loader streams
    (one tensor in flight), but the weights are counted whole: reading the checkpoint fills the
    page cache, which the pod's memory cgroup is charged for, and a checkpoint stored in a wider
    dtype than it is served in is larger still than `weights_bytes`."""
    if spec.runtime.memory is not None:
        return quantity_bytes(spec.runtime.memory)
    if spec.model.source.startswith("sim:"):
        return SIM_POD_MEMORY_BYTES
    return budget.weights_bytes + spec.runtime.gpus_per_pod * RUNTIME_OVERHEAD_BYTES


def mebibytes(num_bytes: int) -> str:
    """A Kubernetes quantity of whole MiB, rounded up."""
    return f"{-(-num_bytes // 2**20)}Mi"


def gib(num_bytes: int) -> str:
    """Bytes for humans: GiB from 1 GiB up, MiB below."""
    if abs(num_bytes) >= 2**30:
        return f"{num_bytes / 2**30:.2f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB"


def preset(name: str) -> Architecture:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def architecture_from_hf_config(path: Path) -> Architecture:
    """The architecture in an HF `config.json` (a missing key is one clear error)."""
    config = json.loads(Path(path).read_text())
    model_type = config.get("model_type", "llama")
    if model_type not in get_args(ModelType):
        raise ValueError(
            f"{path}: model_type {model_type!r} is not served by the runtime (it serves "
            f"{', '.join(get_args(ModelType))})"
        )
    optional = ("model_type", "head_dim", "tie_word_embeddings")
    required = [k for k in HF_CONFIG_KEYS if k not in optional]
    missing = [key for key in required if key not in config]
    if "num_key_value_heads" in missing:
        # Llama-1-style configs leave it out: plain multi-head attention.
        config["num_key_value_heads"] = config.get("num_attention_heads")
        missing.remove("num_key_value_heads")
    if missing:
        raise ValueError(f"{path}: config.json lacks {', '.join(missing)}")
    return Architecture(**{k: config[k] for k in HF_CONFIG_KEYS if config.get(k) is not None})


def architecture_for(spec: InferenceServiceSpec) -> Architecture:
    """The architecture a spec names: explicit, else its preset, else its builtin's preset."""
    if spec.model.architecture is not None:
        return spec.model.architecture
    if spec.model.preset is not None:
        return preset(spec.model.preset)
    return preset(spec.model.source.removeprefix("builtin:"))


def sequence_length(
    memory: MemorySpec, mean_sequence_tokens: float | None, last: int | None = None
) -> int:
    """L of B_mem: the observed mean length when the spec asks for it (the runtime's block
    manager overcommits and preempts, like vLLM, so a sequence longer than the mean costs a
    preemption, not an out-of-memory); while none is observed (a quiet window) the last one stays
    in force; else maxModelLen."""
    if memory.length_estimate != "observedMean":
        return memory.max_model_len
    if mean_sequence_tokens:
        return min(memory.max_model_len, max(1, round(mean_sequence_tokens)))
    return min(memory.max_model_len, last) if last else memory.max_model_len


def plan_for_spec(
    spec: InferenceServiceSpec, *, sequence_length: int | None = None
) -> MemoryBudget:
    """The budget of one pod of an InferenceService (raises ValueError when nothing fits)."""
    return plan_memory(
        architecture_for(spec),
        gpu_memory_bytes=quantity_bytes(spec.runtime.gpu_memory),
        gpus=spec.runtime.gpus_per_pod,
        utilization=spec.memory.gpu_memory_utilization,
        dtype=spec.model.dtype,
        max_model_len=spec.memory.max_model_len,
        reserve_bytes=quantity_bytes(spec.memory.reserve),
        max_num_batched_tokens=spec.batching.max_num_batched_tokens,
        sequence_length=sequence_length,
    )
