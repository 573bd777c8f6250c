"""The built-in models' shapes (`builtin:NAME`), in one table: the runtime generates a model of
each shape (random weights, `wok_runtime.core.builtin`), the operator sizes its pods by it
(`wok_operator.budget.PRESETS`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class BuiltinShape:
    """A Llama-family shape, in Hugging Face `config.json`'s names."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float

    def memory_shape(self) -> dict[str, Any]:
        """The fields that size the weights and the KV cache (all but the rotary base)."""
        fields = asdict(self)
        del fields["rope_theta"]
        return fields


BUILTIN_SHAPES: dict[str, BuiltinShape] = {
    "tiny": BuiltinShape(
        num_hidden_layers=4,
        hidden_size=256,
        intermediate_size=688,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        vocab_size=8192,
        tie_word_embeddings=False,
        max_position_embeddings=2048,
        rope_theta=10000.0,
    ),
    # SmolLM2-135M's real shape (the runtime's copy has random weights).
    "smollm2-135m": BuiltinShape(
        num_hidden_layers=30,
        hidden_size=576,
        intermediate_size=1536,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
    ),
}
