"""The shape of a Llama-family model, read from (and written to) a Hugging Face `config.json`.

One small frozen record that every torch file of the runtime reads (model, runner, loader) and
that the KV budget is computed from, so the shape is validated once, where it enters.

The family is Llama's decoder and the few variations that the models people run make to it:
Llama 3.1+'s rotary scaling (`llama3`), Qwen2's bias on the Q/K/V projections, Qwen3's RMSNorm
of each query and key head. Mistral 7B v0.3 is Llama's shape. Anything else a config asks for
(another RoPE scaling, sliding-window attention, another activation) is refused here, with the
key that asks for it: served as plain Llama it would load, run and answer wrongly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

#: `model_type`s of the configs the runtime serves.
ModelType = Literal["llama", "mistral", "qwen2", "qwen3"]
MODEL_TYPES: tuple[str, ...] = get_args(ModelType)
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
#: RoPE types that `model.rope_tables` implements ("default" is plain RoPE).
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's rotary scaling: long wavelengths slowed by `factor`, short ones kept, and
    the band between them interpolated (the `llama3` rope_type of transformers)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.original_max_position_embeddings <= 0:
            raise ValueError("llama3 rope scaling: factor and original length must be positive")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError("llama3 rope scaling: 0 < low_freq_factor < high_freq_factor")


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    model_type: ModelType = "llama"
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        for name in ("bos_token_id", "eos_token_id"):
            token = getattr(self, name)
            if token is not None and not 0 <= token < self.vocab_size:
                raise ValueError(f"{name} {token} is outside the vocabulary ({self.vocab_size})")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not one of {MODEL_TYPES}")

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 adds a bias to the Q, K and V projections (and nowhere else)."""
        return self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Qwen3 RMS-normalises each query and key head before the rotation."""
        return self.model_type == "qwen3"

    @property
    def max_position(self) -> int:
        """The longest sequence the rotary tables cover (alias of max_position_embeddings)."""
        return self.max_position_embeddings

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token across all layers: 2 · layers · kv_heads · head_dim · bytes."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Reads a transformers config of a supported family; refuses what it cannot serve
        (naming the key) instead of loading it wrongly."""
        model_type = raw.get("model_type", "llama")
        if model_type not in MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; the runtime serves "
                f"{', '.join(MODEL_TYPES)}"
            )
        _refuse_unsupported(raw, model_type)
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        head_dim = raw.get("head_dim") or hidden // heads
        rope = _rope_parameters(raw)
        return cls(
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            vocab_size=int(raw["vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=_single_token(raw.get("bos_token_id")),
            eos_token_id=_single_token(raw.get("eos_token_id")),
            model_type=model_type,
            rope_scaling=_rope_scaling(rope),
        )

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` that transformers reads back to the same model."""
        rope_scaling = None
        if self.rope_scaling is not None:
            rope_scaling = {"rope_type": "llama3", **asdict(self.rope_scaling)}
        return {
            "architectures": [_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "hidden_act": "silu",
            "attention_bias": self.qkv_bias,
            "mlp_bias": False,
            "sliding_window": None,
            "torch_dtype": "float32",
        }


def _single_token(value: Any) -> int | None:
    # Some configs list several EOS ids; the runtime stops on the first (more go in stop_token_ids).
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _rope_parameters(raw: dict[str, Any]) -> dict[str, Any]:
    """RoPE's settings in one dict, wherever the config keeps them: transformers 5 nests them
    all under `rope_parameters`; older configs keep `rope_theta` at the top and the scaling
    under `rope_scaling` (whose type key was once `type`). A type either key names that the
    runtime lacks is refused, even if the other key says "default"."""
    merged: dict[str, Any] = {}
    types = []
    for key in ("rope_parameters", "rope_scaling"):
        section = dict(raw.get(key) or {})
        types.append(section.pop("type", None) or section.get("rope_type") or "default")
        _check_rope_type(types[-1])
        merged.update(section)
    merged["rope_type"] = next((t for t in types if t != "default"), "default")
    for key in ("rope_theta", "partial_rotary_factor"):
        if raw.get(key) is not None:
            merged[key] = raw[key]
    return merged


def _check_rope_type(rope_type: str) -> None:
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"RoPE type {rope_type!r} is not supported (the runtime implements "
            f"{', '.join(ROPE_TYPES)}); serving it as plain RoPE would answer wrongly"
        )


def _rope_scaling(rope: dict[str, Any]) -> Llama3RopeScaling | None:
    rope_type = rope.get("rope_type", "default")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    if rope_type == "default":
        return None
    return Llama3RopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )


def _refuse_unsupported(raw: dict[str, Any], model_type: str) -> None:
    """Config keys that change what the model computes in ways the runtime does not."""
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (SwiGLU with silu only)")
    if raw.get("mlp_bias"):
        raise ValueError("mlp_bias is not supported")
    # Qwen2 always has Q/K/V biases (its config has no key for them); other families none.
    if model_type != "qwen2" and raw.get("attention_bias"):
        raise ValueError(f"attention_bias is not supported for model_type {model_type!r}")
    layer_types = raw.get("layer_types") or []
    if raw.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        raise ValueError(
            "sliding-window attention (use_sliding_window, layer_types) is not supported"
        )
    window = raw.get("sliding_window")
    max_position = int(raw.get("max_position_embeddings", 2048))
    if model_type == "mistral" and window is not None and window < max_position:
        raise ValueError(f"sliding_window {window} is not supported (Mistral 7B v0.3 has none)")
