"""bfloat16 linear layers on AMX through torch's own brgemm, a small C++ kernel for the CPU.

Why: a decode step reads every weight of the model once, so its GEMMs take as long as the
memory takes to stream the weights, plus what each call costs before it reads a byte. torch's
oneDNN linear on a prepacked weight (`Linear.pack`) costs about 18 µs a call and ran a pass over
SmolLM2's 121 linears at 1 to 32 rows 8–10 % slower than vLLM's own oneDNN handler
(bench/runtime/results/cpu_linear_ops.md). This kernel calls the AMX micro-kernel that torch exports
(`at::native::cpublas::brgemm`, oneDNN's ukernel) directly, as the SGLang and vLLM CPU backends
do for small GEMMs: each weight is stored once, in blocks of 64 (or 32) output features laid
out as brgemm reads them (`at::native::cpublas::pack`: W^T, pairs of inputs interleaved), and a
call runs one brgemm per block and per 128 rows, sums in fp32, rounded once to bfloat16 (oneDNN's
sums too). Steps of hundreds of rows (prefill chunks) run a few per cent slower than on oneDNN;
decode steps, where a server's time goes, faster (bench/runtime/results/cpu_linear_ops.md).

Built by `cpu_extension.build` under `--compile`, on CPUs with AMX only (without it brgemm wants
another layout); a model that cannot have it keeps oneDNN's packed weights.
"""

from __future__ import annotations

from types import ModuleType

import torch

from wok_runtime.kernels import cpu_extension

#: Output features per packed block: 64 where they divide the layer's (each brgemm call then
#: reuses its rows of x for twice the outputs, which pays in prefill chunks), else 32.
BLOCK_SIZES = (64, 32)

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <immintrin.h>
#include <optional>

constexpr int64_t kBlockM = 128;  // input rows per brgemm call: its fp32 sums stay in L1/L2
constexpr int64_t kGroupN = 4;  // output blocks per pass over the rows: their weights fit L2

// weight (N, K) -> (N / block_n, K / 2, block_n, 2): each block of outputs is its W^T in
// brgemm's VNNI layout.
torch::Tensor pack_weight(torch::Tensor weight, int64_t block_n) {
  TORCH_CHECK(at::native::cpublas::could_pack(at::kBFloat16),
              "brgemm cannot pack bfloat16 weights on this CPU (no AMX)");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16);
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK((block_n == 32 || block_n == 64) && N % block_n == 0 && K % 2 == 0,
              "no whole blocks of ", block_n, " in a ", N, "x", K, " weight");
  auto transposed = weight.view({N / block_n, block_n, K}).transpose(1, 2).contiguous();
  auto packed = torch::empty({N / block_n, K / 2, block_n, 2}, weight.options());
  for (int64_t b = 0; b < N / block_n; ++b) {
    at::native::cpublas::pack(K, block_n, block_n, block_n, at::kBFloat16, at::kBFloat16,
                              transposed[b].data_ptr(), packed[b].data_ptr());
  }
  return packed;
}

// x (M, K) bf16 @ the packed weight's W^T (+ bias) -> (M, N) bf16. BN: the block's outputs.
template <int64_t BN>
void run(const at::BFloat16* x, const at::BFloat16* w, const float* bias, at::BFloat16* out,
         int64_t M, int64_t N, int64_t K) {
  at::parallel_for(0, N / BN, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float sums[kBlockM * BN];
    // A group's weights stay in L2 while every chunk of rows passes: block by block, all the
    // rows of a 2048-token prefill (2.4 MB of x for SmolLM2) were streamed again for each.
    for (int64_t g0 = begin; g0 < end; g0 += kGroupN) {
      for (int64_t m0 = 0; m0 < M; m0 += kBlockM) {
        const int64_t rows = std::min(kBlockM, M - m0);
        for (int64_t nb = g0; nb < std::min(g0 + kGroupN, end); ++nb) {
          at::native::cpublas::brgemm(rows, BN, K, K, BN, BN, false, x + m0 * K,
                                      w + nb * K * BN, sums, true);
          for (int64_t r = 0; r < rows; ++r) {
            auto* o = reinterpret_cast<__m256i*>(out + (m0 + r) * N + nb * BN);
            for (int64_t j = 0; j < BN / 16; ++j) {
              __m512 v = _mm512_load_ps(sums + r * BN + j * 16);
              if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + nb * BN + j * 16));
              _mm256_storeu_si256(o + j, (__m256i)_mm512_cvtneps_pbh(v));
            }
          }
        }
      }
    }
    at::native::cpublas::brgemm_release();
  });
}

torch::Tensor linear(torch::Tensor x, torch::Tensor packed, std::optional<torch::Tensor> bias) {
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), BN = packed.size(2), N = packed.size(0) * BN;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.size(1) * 2 == K);
  auto out = torch::empty({M, N}, x.options());
  // The runtime passes an fp32 bias (Linear.bias32): then neither call allocates.
  torch::Tensor bias32 = bias ? bias->to(at::kFloat).contiguous() : torch::Tensor();
  const float* bp = bias ? bias32.data_ptr<float>() : nullptr;
  const auto* xp = x.data_ptr<at::BFloat16>();
  const auto* wp = packed.data_ptr<at::BFloat16>();
  auto* op = out.data_ptr<at::BFloat16>();
  if (BN == 64) run<64>(xp, wp, bp, op, M, N, K);
  else run<32>(xp, wp, bp, op, M, N, K);
  return out;
}
"""

_module: ModuleType | None = None


def load() -> bool:
    """Builds the kernel (or finds it in the cache) on a CPU with AMX; whether it is there."""
    global _module
    if _module is None and torch.cpu._is_amx_tile_supported():
        _module = cpu_extension.build("wok_brgemm_linear", SOURCE, ["pack_weight", "linear"])
    return _module is not None


def fits(out_features: int, in_features: int) -> bool:
    """Whether a weight of this shape packs into whole blocks."""
    return out_features % BLOCK_SIZES[-1] == 0 and in_features % 2 == 0


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight (out, in), bfloat16, in the kernel's blocked layout; `load()` first."""
    assert _module is not None, "brgemm_linear.load() first"
    block = next(b for b in BLOCK_SIZES if weight.shape[0] % b == 0)
    return _module.pack_weight(weight.contiguous(), block)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T + bias for a weight packed by `pack`."""
    return _module.linear(x, packed, bias)  # type: ignore[union-attr]


@torch.library.custom_op("wok::brgemm_linear", mutates_args=())
def brgemm_op(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`linear` as an op of its own, which torch.compile calls as it is."""
    return linear(x, packed, bias)


@brgemm_op.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], packed.shape[0] * packed.shape[2])
