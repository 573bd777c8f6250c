"""Decode attention that reads the paged KV blocks in place, a small C++ kernel for the CPU.

Why: in plain torch a decode group's attention first gathers its sequences' blocks into one
tensor (`index_select`) and then runs SDPA over the copy, so every key and value crosses memory
three times: read, written, read again. At 32 sequences on SmolLM2 that was a third of a decode
step (bench/runtime/results/runtime_step.md). This kernel walks each sequence's block table and
reads every key and value once, as vLLM's CPU attention does: one (sequence, KV head) at a time, the
query heads that share the KV head together, a block's scores first and then one softmax
rescale per block (online softmax), all in fp32.

It is built by `cpu_extension.build` and used only under `--compile`; `load()` returns None, and
attention stays on SDPA, if it cannot be built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from wok_runtime.kernels import cpu_extension

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

// bf16 to fp32 is the top half of the fp32 bits: a shift the compiler vectorises.
template <typename T>
inline float to_float(T x) { return static_cast<float>(x); }
template <>
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The running maximum before any score: finite, so that -ffast-math (which assumes no
// infinities, and lets expf vectorise) holds; exp(kNoScore - score) is 0.
constexpr float kNoScore = -3.0e38f;

// q (B, H, D), rows of D contiguous; k_blocks, v_blocks (KVH, NB, BS, D); block_tables (B, MB);
// lengths (B,) int64 -> (B, H, D). Query head h reads KV head h / (H / KVH). D is a template
// argument so that every loop over it has a known trip count and vectorises.
template <typename T, int D>
void attend(const torch::Tensor& q, const torch::Tensor& k_blocks, const torch::Tensor& v_blocks,
            const torch::Tensor& block_tables, const torch::Tensor& lengths, float scale,
            torch::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1);
  const int64_t KVH = k_blocks.size(0), NB = k_blocks.size(1), BS = k_blocks.size(2);
  const int64_t G = H / KVH, MB = block_tables.size(1), q_row = q.stride(0), q_head = q.stride(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_blocks.data_ptr<T>();
  const T* vp = v_blocks.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = lengths.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q_buf(G * D), acc_buf(G * D), probs_buf(G * BS), m(G), l(G);
    float* __restrict__ qf = q_buf.data();
    float* __restrict__ acc = acc_buf.data();
    float* __restrict__ probs = probs_buf.data();
    alignas(64) float row[D];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / KVH, kvh = item % KVH;
      for (int64_t g = 0; g < G; ++g) {
        const T* qrow = qp + b * q_row + (kvh * G + g) * q_head;
        for (int d = 0; d < D; ++d) qf[g * D + d] = to_float(qrow[d]) * scale;
      }
      std::fill(acc, acc + G * D, 0.f);
      std::fill(m.begin(), m.end(), kNoScore);
      std::fill(l.begin(), l.end(), 0.f);
      const int64_t len = lens[b];
      for (int64_t blk = 0; blk * BS < len; ++blk) {
        const int64_t n = std::min(BS, len - blk * BS);
        const int64_t base = (kvh * NB + tables[b * MB + blk]) * BS * D;
        if ((blk + 1) * BS < len) {  // the next block's keys and values, while this one runs
          const int64_t next = (kvh * NB + tables[b * MB + blk + 1]) * BS * D;
          for (int64_t byte = 0; byte < BS * D * (int64_t)sizeof(T); byte += 64) {
            __builtin_prefetch(reinterpret_cast<const char*>(kp + next) + byte);
            __builtin_prefetch(reinterpret_cast<const char*>(vp + next) + byte);
          }
        }
        // Scores: each key converted to fp32 once, for every query head of the group.
        for (int64_t t = 0; t < n; ++t) {
          const T* key = kp + base + t * D;
          for (int d = 0; d < D; ++d) row[d] = to_float(key[d]);
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qf + g * D;
            float s = 0.f;
            for (int d = 0; d < D; ++d) s += qg[d] * row[d];
            probs[g * BS + t] = s;
          }
        }
        // Online softmax: one rescale of the running sums per block.
        for (int64_t g = 0; g < G; ++g) {
          float* p = probs + g * BS;
          float block_max = kNoScore;
          for (int64_t t = 0; t < n; ++t) block_max = std::max(block_max, p[t]);
          const float new_max = std::max(m[g], block_max);
          const float rescale = std::exp(m[g] - new_max);  // 0 on the first block
          m[g] = new_max;
          float sum = 0.f;
          for (int64_t t = 0; t < n; ++t) {
            p[t] = std::exp(p[t] - new_max);
            sum += p[t];
          }
          l[g] = l[g] * rescale + sum;
          for (int d = 0; d < D; ++d) acc[g * D + d] *= rescale;
        }
        // Values: each converted once, added into every query head's sum.
        for (int64_t t = 0; t < n; ++t) {
          const T* value = vp + base + t * D;
          for (int d = 0; d < D; ++d) row[d] = to_float(value[d]);
          for (int64_t g = 0; g < G; ++g) {
            const float p = probs[g * BS + t];
            float* ag = acc + g * D;
            for (int d = 0; d < D; ++d) ag[d] += p * row[d];
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        T* orow = op + (b * H + kvh * G + g) * D;
        for (int d = 0; d < D; ++d) orow[d] = static_cast<T>(acc[g * D + d] / l[g]);
      }
    }
  });
}

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_blocks,
                                     torch::Tensor v_blocks, torch::Tensor block_tables,
                                     torch::Tensor lengths, double scale) {
  TORCH_CHECK(q.stride(2) == 1 && k_blocks.is_contiguous() && v_blocks.is_contiguous());
  TORCH_CHECK(block_tables.is_contiguous() && lengths.is_contiguous());
  auto out = torch::empty(q.sizes(), q.options());
  const int64_t D = q.size(2);
  TORCH_CHECK(D == 32 || D == 64 || D == 128, "head_dim must be 32, 64 or 128, got ", D);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    auto run = [&](auto head_dim) {
      attend<scalar_t, decltype(head_dim)::value>(q, k_blocks, v_blocks, block_tables, lengths,
                                                  scale, out);
    };
    if (D == 32) run(std::integral_constant<int, 32>());
    else if (D == 64) run(std::integral_constant<int, 64>());
    else run(std::integral_constant<int, 128>());
  });
  return out;
}

// k, v (T, KVH, D), rows of D contiguous, into the slots (T,) of k_blocks, v_blocks
// (KVH, NB, BS, D): slot s of head h is row h * NB * BS + s. One memcpy a row: index_copy_
// through a transposed view walks them element by element.
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor slots, torch::Tensor k_blocks,
              torch::Tensor v_blocks) {
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && slots.is_contiguous());
  TORCH_CHECK(k_blocks.is_contiguous() && v_blocks.is_contiguous());
  TORCH_CHECK(k.scalar_type() == k_blocks.scalar_type());
  TORCH_CHECK(v.scalar_type() == v_blocks.scalar_type());
  const int64_t T = k.size(0), KVH = k.size(1), D = k.size(2);
  const int64_t S = k_blocks.size(1) * k_blocks.size(2), bytes = D * k.element_size();
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto copy = [&](const torch::Tensor& src, torch::Tensor& dst) {
    const char* from = static_cast<const char*>(src.data_ptr());
    char* to = static_cast<char*>(dst.data_ptr());
    const int64_t row = src.stride(0) * src.element_size();
    const int64_t head = src.stride(1) * src.element_size();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < KVH; ++h)
        std::memcpy(to + (h * S + sp[t]) * bytes, from + t * row + h * head, bytes);
  };
  copy(k, k_blocks);
  copy(v, v_blocks);
}
"""

#: The head sizes the kernel is built for (compile-time loop bounds); others stay on SDPA.
HEAD_DIMS = (32, 64, 128)


@dataclass(frozen=True)
class Kernel:
    """The built functions; see SOURCE."""

    #: q, k_blocks, v_blocks, block_tables, lengths, scale -> out
    attend: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
    ]
    #: k, v, slots, k_blocks, v_blocks: the step's K/V written into their slots
    write_kv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def load() -> Kernel | None:
    """The kernel, built (or found in the cache) for this CPU; None if it cannot be built."""
    module = cpu_extension.build(
        "wok_paged_decode",
        SOURCE,
        ["paged_decode_attention", "write_kv"],
        flags=("-ffast-math",),
    )
    return None if module is None else Kernel(module.paged_decode_attention, module.write_kv)
