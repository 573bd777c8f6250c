"""The paged decode attention kernel computes what SDPA computes over each sequence's keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wok_runtime.kernels import paged_decode

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
    # q as the model hands it over: the query heads of a packed (T, H + 2 * KVH, hd) projection.
    qkv = torch.randn(len(lengths), heads + 2 * kv_heads, head_dim).to(dtype)
    q = qkv[:, :heads]
    tables_t, lengths_t = torch.tensor(tables), torch.tensor(lengths)
    got = kernel.attend(q, k_blocks, v_blocks, tables_t, lengths_t, head_dim**-0.5)
    want = reference(q, k_blocks, v_blocks, tables, lengths)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_puts_each_row_where_index_copy_does(
    kernel: paged_decode.Kernel, dtype: torch.dtype
) -> None:
    torch.manual_seed(1)
    kv_heads, n_blocks, head_dim, heads = 3, 10, 64, 9
    k_blocks = torch.zeros(kv_heads, n_blocks, BLOCK, head_dim, dtype=dtype)
    v_blocks = torch.zeros_like(k_blocks)
    qkv = torch.randn(5, heads + 2 * kv_heads, head_dim).to(dtype)  # k, v: strided views
    k, v = qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    slots = torch.tensor([0, 17, BLOCK * n_blocks - 1, 42, 5])
    kernel.write_kv(k, v, slots, k_blocks, v_blocks)
    want_k, want_v = torch.zeros_like(k_blocks), torch.zeros_like(v_blocks)
    flat = (kv_heads, n_blocks * BLOCK, head_dim)
    want_k.view(flat).index_copy_(1, slots, k.transpose(0, 1))
    want_v.view(flat).index_copy_(1, slots, v.transpose(0, 1))
    assert torch.equal(k_blocks, want_k) and torch.equal(v_blocks, want_v)
