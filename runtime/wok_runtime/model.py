"""A Llama-architecture decoder in plain torch: the one file that says what the model computes.

The tokens of a step arrive packed, one row per token from every sequence of the batch (no batch
dimension, no padding), as in vLLM. Attention is the only part that needs to know which token
belongs to which sequence and where its past K/V lives, so it is delegated to an
`AttentionBackend` passed to `forward`: the model runner passes the paged-KV backend; tests and
benchmarks pass others. Everything else (projections, rotary embeddings, MLP, norms) is
sequence-agnostic and runs once over all packed tokens.

Weights are held fused (`qkv_proj`, `gate_up_proj`) because on a CPU at decode batch sizes every
matmul call costs fixed overhead; `hf_weight_map` maps the Hugging Face names onto them.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from wok_runtime.model_config import ModelConfig


class AttentionBackend(Protocol):
    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q (T, n_heads, head_dim), k/v (T, n_kv_heads, head_dim) -> (T, n_heads, head_dim)."""
        ...


class Linear(nn.Module):
    """A bias-free linear layer whose weight is left uninitialised: every weight is loaded from
    a checkpoint, and drawing a random init for 135M parameters costs seconds at start-up."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))  # loaded, not initialised

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # One fused op instead of five: per-op overhead matters at decode batch sizes.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 as Hugging Face does, so fp16/bf16 runs agree with the reference.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(config: ModelConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: (length, head_dim) in fp32, laid out for the rotate-half convention.

    The first half of `sin` is negated, so applying rotary embeddings is
    `x * cos + swap_halves(x) * sin`, with no negation at run time."""
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )  # (head_dim/2,)
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()  # (length, head_dim/2)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, head_dim); cos/sin (T, 1, head_dim) from `rope_tables`, in x's dtype."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_size = self.n_heads * self.head_dim
        kv_size = self.n_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size)
        self.o_proj = Linear(q_size, config.hidden_size)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        T = x.shape[0]
        H, KVH = self.n_heads, self.n_kv_heads
        qkv = self.qkv_proj(x).view(T, H + 2 * KVH, self.head_dim)  # (T, H + 2*KVH, hd)
        # q and k rotate in one call: elementwise calls dominate small decode steps.
        qk = apply_rope(qkv[:, : H + KVH], cos, sin)  # (T, H + KVH, hd)
        q, k = qk[:, :H], qk[:, H:]  # (T, H, hd), (T, KVH, hd)
        v = qkv[:, H + KVH :]  # (T, KVH, hd)
        out = attention(self.layer, q, k, v)  # (T, H, hd)
        return self.o_proj(out.reshape(T, -1))  # (T, hidden)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, intermediate) each
        return self.down_proj(F.silu(gate) * up)  # SwiGLU


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(config, config.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_pos, hd), fp32
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> torch.Tensor:
        """input_ids, positions: (T,) packed tokens -> hidden states (T, hidden), before the
        final norm (the caller picks the rows it needs logits for)."""
        x = self.embed_tokens(input_ids)  # (T, hidden)
        # Rotary tables are looked up once per step and shared by every layer.
        cos = self.rope_cos[positions].to(x.dtype)[:, None, :]  # (T, 1, hd)
        sin = self.rope_sin[positions].to(x.dtype)[:, None, :]
        for block in self.layers:
            x = block(x, cos, sin, attention)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, hidden) -> fp32 logits (N, vocab)."""
        return self.lm_head(self.norm(hidden)).float()


def hf_weight_map(config: ModelConfig) -> dict[str, tuple[str, slice]]:
    """Where each Hugging Face LlamaForCausalLM tensor goes: (this module's parameter, its
    rows). The fused parameters take several: q, k, v stacked in `qkv_proj`, gate and up in
    `gate_up_proj`, so the loader can copy each tensor into its rows as it reads it."""
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    whole = slice(None)
    out = {"model.embed_tokens.weight": ("embed_tokens.weight", whole)}
    out["model.norm.weight"] = ("norm.weight", whole)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = ("lm_head.weight", whole)
    qkv_rows = {
        "q": slice(0, q_rows),
        "k": slice(q_rows, q_rows + kv_rows),
        "v": slice(q_rows + kv_rows, q_rows + 2 * kv_rows),
    }
    gate_up_rows = {
        "gate": slice(0, config.intermediate_size),
        "up": slice(config.intermediate_size, 2 * config.intermediate_size),
    }
    for i in range(config.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        for proj, rows in qkv_rows.items():
            out[src + f"self_attn.{proj}_proj.weight"] = (dst + "self_attn.qkv_proj.weight", rows)
        for proj, rows in gate_up_rows.items():
            out[src + f"mlp.{proj}_proj.weight"] = (dst + "mlp.gate_up_proj.weight", rows)
        for name in ("self_attn.o_proj", "mlp.down_proj", "input_layernorm",
                     "post_attention_layernorm"):  # fmt: skip
            out[src + f"{name}.weight"] = (dst + f"{name}.weight", whole)
    return out


class CausalAttention:
    """Attention for one whole sequence without a cache (a reference, and for tests)."""

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],  # (1, H, T, hd)
            k.transpose(0, 1)[None],  # (1, KVH, T, hd)
            v.transpose(0, 1)[None],
            is_causal=True,
            enable_gqa=True,
        )  # (1, H, T, hd)
        return out[0].transpose(0, 1)  # (T, H, hd)
