"""A Llama-family decoder in plain torch: the one file that says what the model computes.

The tokens of a step arrive packed, one row per token from every sequence of the batch (no batch
dimension, no padding), as in vLLM. Attention is the only part that needs to know which token
belongs to which sequence and where its past K/V lives, so it is delegated to an
`AttentionBackend` passed to `forward`: the model runner passes the paged-KV backend; tests and
benchmarks pass others. Everything else (projections, rotary embeddings, MLP, norms) is
sequence-agnostic and runs once over all packed tokens.

Weights are held fused (`qkv_proj`, `gate_up_proj`) because on a CPU at decode batch sizes every
matmul call costs fixed overhead; `hf_weight_map` maps the Hugging Face names onto them.

The family's variations are switches of `ModelConfig` (see model_config.py): Llama 3.1's scaled
rotary frequencies (`rope_tables`), Qwen2's Q/K/V bias, Qwen3's per-head q/k RMSNorm.

Under tensor parallelism (parallel.py) each rank builds the same modules with 1/N of the heads
and MLP columns, and sums the partial outputs of `o_proj` and `down_proj` across the ranks.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from wok_runtime.core.model_config import Llama3RopeScaling, ModelConfig
from wok_runtime.core.parallel import SINGLE, Parallel
from wok_runtime.kernels import brgemm_linear


class AttentionBackend(Protocol):
    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q (T, n_heads, head_dim), k/v (T, n_kv_heads, head_dim) -> (T, n_heads, head_dim)."""
        ...


#: Rows from which a bfloat16 linear on a CPU with fp32 copies of its weights runs on them:
#: without AMX, oneDNN's bf16 GEMM reaches about half the fp32 kernel's rate once a GEMM is
#: compute-bound; below this, reading half the bytes wins (bench/runtime/results/cpu_kernels.md).
FP32_GEMM_MIN_ROWS = 32

#: The rows a prepacked weight's blocked layout is chosen for (oneDNN's hint; vLLM's CPU backend
#: packs for 32 too): the decode batches where a step's time goes.
PACKED_GEMM_ROWS = 32


#: oneDNN's linear on a prepacked weight, the overload bound once (no lookup per call).
_PACKED_LINEAR = torch.ops.mkldnn._linear_pointwise.default


@torch.library.custom_op("wok::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T + bias on a weight prepacked by `Linear.pack`. An op of its own so that
    torch.compile calls it as it is: inductor lowers the oneDNN op only for frozen weights."""
    return _PACKED_LINEAR(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], packed.shape[0])


class Linear(nn.Module):
    """A linear layer whose weight is left uninitialised: every weight is loaded from a
    checkpoint, and drawing a random init for 135M parameters costs seconds at start-up.

    On a CPU a bfloat16 linear can run on its weight reordered once into oneDNN's blocked layout
    (`pack`, on CPUs with AMX), or into brgemm's (`pack_for_brgemm`, under `--compile` on CPUs
    with AMX), or, without AMX, on fp32 copies for large steps (`keep_fp32_copy`);
    bench/runtime/results/cpu_kernels.md and cpu_linear_ops.md measured them."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | None = None  # see pack
        self.brgemm_packed: torch.Tensor | None = None  # see pack_for_brgemm
        self.weight32: torch.Tensor | None = None  # see keep_fp32_copy
        self.bias32: torch.Tensor | None = None  # see keep_fp32_copy and pack_for_brgemm

    def pack(self, *, keep_weight: bool = False) -> None:
        """Reorders the weight once into oneDNN's blocked layout, which F.linear would redo on
        every call, and runs every step on it (the same sums: only the layout changes). The
        plain weight is dropped unless `keep_weight` (a tied lm_head's is the embedding's)."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(
            self.weight.detach(), PACKED_GEMM_ROWS
        )
        if not keep_weight:
            self.weight = nn.Parameter(self.weight.new_empty(0), requires_grad=False)

    def pack_for_brgemm(self, *, keep_weight: bool = False) -> None:
        """Moves the weight, plain or packed for oneDNN, into brgemm_linear's blocked layout
        (`brgemm_linear.load()` first) and runs every step on it; one copy stays."""
        plain = self.weight.detach() if self.packed is None else self.packed.to_dense()
        self.brgemm_packed = brgemm_linear.pack(plain)
        self.bias32 = None if self.bias is None else self.bias.float()  # added to the fp32 sums
        self.packed = None
        if not keep_weight:
            self.weight = nn.Parameter(self.weight.new_empty(0), requires_grad=False)

    def keep_fp32_copy(self) -> None:
        """Holds fp32 copies of the weights for steps of FP32_GEMM_MIN_ROWS rows or more."""
        self.weight32 = self.weight.float()
        self.bias32 = None if self.bias is None else self.bias.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()
        if self.brgemm_packed is not None:
            if compiling:
                return brgemm_linear.brgemm_op(x, self.brgemm_packed, self.bias32)
            return brgemm_linear.linear(x, self.brgemm_packed, self.bias32)
        if self.packed is not None:
            if compiling:
                return packed_linear(x, self.packed, self.bias)
            # Eager, the oneDNN op itself: a custom op's dispatch costs about as much again.
            return _PACKED_LINEAR(x, self.packed, self.bias, "none", [], "")
        # A compiled step's rows are unknown to its graph (step_graph.py): it keeps bf16.
        if self.weight32 is not None and not compiling and x.shape[0] >= FP32_GEMM_MIN_ROWS:
            # bf16 inputs and weights are exact in fp32: the same fp32 sums as the bf16 GEMM's,
            # rounded once to x's dtype.
            return F.linear(x.float(), self.weight32, self.bias32).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


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
    if config.rope_scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, config.rope_scaling)
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()  # (length, head_dim/2)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1's frequencies: wavelengths longer than the original context / low_freq_factor
    slowed by `factor` (so they span the longer context), those shorter than
    original / high_freq_factor kept (local order), and a linear blend in between."""
    old = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq  # (head_dim/2,)
    slow = inv_freq / scaling.factor
    # 0 at the long-wavelength edge of the band, 1 at its short edge.
    smooth = (old / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * slow + smooth * inv_freq
    out = torch.where(wavelen > old / scaling.low_freq_factor, slow, inv_freq)
    in_band = (wavelen >= old / scaling.high_freq_factor) & (
        wavelen <= old / scaling.low_freq_factor
    )
    return torch.where(in_band, blended, out)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, head_dim); cos/sin (T, 1, head_dim) from `rope_tables`, in x's dtype."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, parallel: Parallel = SINGLE) -> None:
        super().__init__()
        self.layer = layer
        self.parallel = parallel
        self.n_heads = config.num_attention_heads // parallel.size  # this rank's heads
        self.n_kv_heads = config.num_key_value_heads // parallel.size
        self.head_dim = config.head_dim
        q_size = self.n_heads * self.head_dim
        kv_size = self.n_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.qkv_bias)
        self.o_proj = Linear(q_size, config.hidden_size)
        # Qwen3: one RMSNorm over head_dim, shared by every query head (and one by every key head).
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        return self.output(attention(self.layer, q, k, v))

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (T, hidden) -> q (T, H, hd), k and v (T, KVH, hd), q and k rotated."""
        T = x.shape[0]
        H, KVH = self.n_heads, self.n_kv_heads
        qkv = self.qkv_proj(x).view(T, H + 2 * KVH, self.head_dim)  # (T, H + 2*KVH, hd)
        qk = qkv[:, : H + KVH]  # (T, H + KVH, hd)
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :H]), self.k_norm(qk[:, H:])), dim=1)
        # q and k rotate in one call: elementwise calls dominate small decode steps.
        qk = apply_rope(qk, cos, sin)  # (T, H + KVH, hd)
        q, k = qk[:, :H], qk[:, H:]  # (T, H, hd), (T, KVH, hd)
        v = qkv[:, H + KVH :]  # (T, KVH, hd)
        return q, k, v

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """Attention's output (T, H, hd) -> (T, hidden)."""
        return self.parallel.all_reduce(self.o_proj(out.flatten(1)))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, parallel: Parallel = SINGLE) -> None:
        super().__init__()
        self.parallel = parallel
        intermediate = config.intermediate_size // parallel.size  # this rank's columns
        self.gate_up_proj = Linear(config.hidden_size, 2 * intermediate)
        self.down_proj = Linear(intermediate, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, intermediate) each
        return self.parallel.all_reduce(self.down_proj(F.silu(gate) * up))  # SwiGLU


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, parallel: Parallel = SINGLE) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer, parallel)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, parallel)

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
    def __init__(self, config: ModelConfig, parallel: Parallel = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.parallel = parallel
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Block(config, i, parallel) for i in range(config.num_hidden_layers)
        )
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

    def linears(self) -> list[Linear]:
        return [m for m in self.modules() if isinstance(m, Linear)]

    def pack_gemm_weights(self) -> None:
        """Every linear's weight prepacked for oneDNN (`Linear.pack`)."""
        for linear in self.linears():
            linear.pack(keep_weight=self._is_tied(linear))

    def pack_gemm_weights_for_brgemm(self) -> int:
        """Every linear whose weight fits brgemm_linear's blocks runs on it
        (`Linear.pack_for_brgemm`; `brgemm_linear.load()` first); returns how many do."""
        fitting = [m for m in self.linears() if brgemm_linear.fits(m.out_features, m.in_features)]
        for linear in fitting:
            linear.pack_for_brgemm(keep_weight=self._is_tied(linear))
        return len(fitting)

    def _is_tied(self, linear: Linear) -> bool:
        """Whether the linear's weight is the embedding's (a tied lm_head): packing keeps it."""
        return linear.weight is self.embed_tokens.weight

    def keep_fp32_gemm_weights(self) -> int:
        """fp32 copies of every linear's weights (`Linear.keep_fp32_copy`); returns their
        bytes."""
        linears = self.linears()
        for linear in linears:
            linear.keep_fp32_copy()
        copies = [t for m in linears for t in (m.weight32, m.bias32) if t is not None]
        return sum(t.nbytes for t in copies)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, hidden) -> fp32 logits (N, vocab)."""
        return self.lm_head(self.norm(hidden)).float()


#: Where one checkpoint tensor goes: (parameter, its rows, the dim a tensor-parallel rank takes
#: its 1/N of, None when every rank holds all of it).
WeightTarget = tuple[str, slice, int | None]


def hf_weight_map(config: ModelConfig, parallel_size: int = 1) -> dict[str, WeightTarget]:
    """Where each Hugging Face tensor (LlamaForCausalLM's names, which the family shares) goes.
    The fused parameters take several: q, k, v stacked in `qkv_proj` (weights and Qwen2's
    biases), gate and up in `gate_up_proj`, so the loader can copy each tensor into its rows as
    it reads it. Under tensor parallelism the rows are a rank's: q, k, v, gate and up are split
    by rows (heads, MLP columns), o_proj and down_proj by columns (their inputs)."""
    q_rows = config.num_attention_heads * config.head_dim // parallel_size
    kv_rows = config.num_key_value_heads * config.head_dim // parallel_size
    intermediate = config.intermediate_size // parallel_size
    whole = slice(None)
    out: dict[str, WeightTarget] = {
        "model.embed_tokens.weight": ("embed_tokens.weight", whole, None),
        "model.norm.weight": ("norm.weight", whole, None),
    }
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = ("lm_head.weight", whole, None)
    qkv_rows = {
        "q": slice(0, q_rows),
        "k": slice(q_rows, q_rows + kv_rows),
        "v": slice(q_rows + kv_rows, q_rows + 2 * kv_rows),
    }
    gate_up_rows = {"gate": slice(0, intermediate), "up": slice(intermediate, 2 * intermediate)}
    for i in range(config.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        for proj, rows in qkv_rows.items():
            out[src + f"self_attn.{proj}_proj.weight"] = (
                dst + "self_attn.qkv_proj.weight",
                rows,
                0,
            )
            if config.qkv_bias:
                out[src + f"self_attn.{proj}_proj.bias"] = (
                    dst + "self_attn.qkv_proj.bias",
                    rows,
                    0,
                )
        if config.qk_norm:
            for name in ("self_attn.q_norm", "self_attn.k_norm"):
                out[src + f"{name}.weight"] = (dst + f"{name}.weight", whole, None)
        for proj, rows in gate_up_rows.items():
            out[src + f"mlp.{proj}_proj.weight"] = (dst + "mlp.gate_up_proj.weight", rows, 0)
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            out[src + f"{name}.weight"] = (dst + f"{name}.weight", whole, 1)
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[src + f"{name}.weight"] = (dst + f"{name}.weight", whole, None)
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
