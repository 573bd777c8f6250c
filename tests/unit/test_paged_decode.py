"""The paged decode attention kernel computes what SDPA computes over each sequence's keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wok_runtime import paged_decode

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK = 16


@pytest.fixture(scope="module")
def kernel() -> paged_decode.Kernel:
    built = paged_decode.load()
    assert built is not None, "the C++ toolchain that --compile needs builds the kernel"
    return built


def reference(
    q: torch.Tensor,
    k_blocks: torch.Tensor,
    v_blocks: torch.Tensor,
    tables: list[list[int]],
    lengths: list[int],
) -> torch.Tensor:
    """Each sequence alone: its keys gathered in order, SDPA in fp32, GQA by repeating."""
    kvh, _, _, hd = k_blocks.shape
    outs = []
    for i, (table, n) in enumerate(zip(tables, lengths, strict=True)):
        keys = k_blocks[:, table].reshape(kvh, -1, hd)[:, :n].float()  # (KVH, n, hd)
        values = v_blocks[:, table].reshape(kvh, -1, hd)[:, :n].float()
        group = q.shape[1] // kvh
        out = F.scaled_dot_product_attention(
            q[i].float()[:, None, :],  # (H, 1, hd)
            keys.repeat_interleave(group, 0),
            values.repeat_interleave(group, 0),
        )
        outs.append(out[:, 0])
    return torch.stack(outs)  # (B, H, hd)


@pytest.mark.parametrize(
    ("dtype", "heads", "kv_heads", "head_dim", "tol"),
    [
        (torch.float32, 6, 2, 64, 1e-5),  # grouped query heads
        (torch.float32, 4, 4, 128, 1e-5),  # one query head per KV head
        (torch.float32, 8, 4, 32, 1e-5),  # builtin:tiny's layout
        (torch.bfloat16, 9, 3, 64, 2e-2),  # SmolLM2's layout; bf16 output rounding
    ],
)
def test_the_kernel_matches_sdpa_over_each_sequence(
    kernel: paged_decode.Kernel,
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tol: float,
) -> None:
    torch.manual_seed(0)
    n_blocks = 40
    k_blocks = torch.randn(kv_heads, n_blocks, BLOCK, head_dim).to(dtype)
    v_blocks = torch.randn(kv_heads, n_blocks, BLOCK, head_dim).to(dtype)
    # One key, a partial block, exact blocks, several blocks: in shuffled blocks.
    lengths = [1, 7, BLOCK, 2 * BLOCK + 5, 5 * BLOCK]
    width = -(-max(lengths) // BLOCK)
    order = torch.randperm(n_blocks).tolist()
    tables = [order[i * width : (i + 1) * width] for i in range(len(lengths))]
    q = torch.randn(len(lengths), heads, head_dim).to(dtype)
    got = kernel(q, k_blocks, v_blocks, torch.tensor(tables), torch.tensor(lengths), head_dim**-0.5)
    want = reference(q, k_blocks, v_blocks, tables, lengths)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)
