"""Attention that reads the KV pool's pages in place: one interface, a kernel per device.

A step's sequences are described the way paged-attention kernels take them (FlashInfer's CSR
form, `PagedBatch`): each sequence's query rows in the packed step (`qo_indptr`), its pages
(`kv_indptr` into `kv_indices`) and how many slots of its last page hold keys. A `PagedKernel`
is planned once a step with it and then attends layer by layer over the pool as it lies:

- `FlashInferKernel` (CUDA): FlashInfer's batch decode (a decode-only step) or batch prefill
  (any other) over the paged cache, no copy of any block (docs/runtime-contract.md says why
  FlashInfer);
- `ReferenceKernel` (any device): SDPA over each sequence's gathered blocks, the definition the
  others are tested against; it runs on the CPU, so the runner's plumbing of this interface is
  tested here.

The CPU's own decode kernel (paged_decode.py) stays where it was, in the runner's default
backend. The pool is the runner's, head-major per layer, (KVH, blocks, bs, hd): a transposed view
of it, (blocks, KVH, bs, hd), is FlashInfer's "HND" layout with strides (no copy).
"""

from __future__ import annotations

import copy
import importlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

#: FlashInfer's scratch space (its examples and vLLM use 128 MiB).
WORKSPACE_BYTES = 128 * 2**20
#: The head sizes FlashInfer's prebuilt kernels serve; others keep the runner's attention.
FLASHINFER_HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True)
class PagedBatch:
    """A step's sequences in CSR form, in the order of their rows in the packed step."""

    qo_indptr: list[int]  # (S + 1,) rows [qo_indptr[s], qo_indptr[s+1]) are sequence s's queries
    kv_indptr: list[int]  # (S + 1,) its pages are kv_indices[kv_indptr[s]:kv_indptr[s+1]]
    kv_indices: list[int]
    kv_last_page_len: list[int]  # (S,) slots of its last page that hold keys, in [1, bs]
    kv_lens: list[int]  # (S,) keys it attends to (its queries are the last of them)

    @property
    def decode_only(self) -> bool:
        return all(b - a == 1 for a, b in zip(self.qo_indptr, self.qo_indptr[1:], strict=False))


def paged_batch(
    query_lens: Sequence[int],
    kv_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
) -> PagedBatch:
    """The CSR description of sequences with these query rows, key counts and block tables (a
    table may be longer than its keys need: only the pages that hold keys are named)."""
    qo, kv, indices, last = [0], [0], [], []
    for q_len, kv_len, table in zip(query_lens, kv_lens, block_tables, strict=True):
        if not 0 < q_len <= kv_len:
            raise ValueError(f"a sequence of {kv_len} keys cannot have {q_len} queries")
        pages = -(-kv_len // block_size)
        if len(table) < pages:
            raise ValueError(f"{len(table)} blocks do not hold {kv_len} keys")
        indices.extend(table[:pages])
        qo.append(qo[-1] + q_len)
        kv.append(kv[-1] + pages)
        last.append(kv_len - (pages - 1) * block_size)
    return PagedBatch(qo, kv, indices, last, list(kv_lens))


class PagedKernel(Protocol):
    """Paged attention over a pool layer: `plan` once a step, then `attend` for each layer."""

    def plan(
        self,
        batch: PagedBatch,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None: ...

    def attend(
        self, q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor
    ) -> torch.Tensor:
        """q (T, H, hd); k/v_blocks (KVH, blocks, bs, hd), the step's K/V already written ->
        (T, H, hd), each query attending causally to its sequence's keys."""
        ...

    def for_graph(self, size: int, max_pages: int) -> PagedKernel:
        """A kernel for a captured decode step of `size` sequences of at most `max_pages`
        pages each: planned (outside the graph) before each replay, its `attend` captured."""
        ...


class ReferenceKernel:
    """SDPA over each sequence's gathered blocks: correct on every device, and slow (a copy of
    every key); the definition the kernels are held to."""

    def __init__(self) -> None:
        self.batch: PagedBatch | None = None

    def plan(
        self,
        batch: PagedBatch,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        self.batch = batch

    def attend(
        self, q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor
    ) -> torch.Tensor:
        assert self.batch is not None, "plan the step first"
        return reference_attention(q, k_blocks, v_blocks, self.batch)

    def for_graph(self, size: int, max_pages: int) -> ReferenceKernel:
        return ReferenceKernel()  # host work in `attend`: no CUDA graph captures it


def reference_attention(
    q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, batch: PagedBatch
) -> torch.Tensor:
    """Sequence by sequence: its pages gathered, cut to its keys, SDPA with the causal mask
    aligned to the end (query i of n sits at key position kv_len - n + i)."""
    kv_heads, _, _, head_dim = k_blocks.shape
    out = torch.empty_like(q)
    index = torch.tensor(batch.kv_indices, dtype=torch.long, device=k_blocks.device)
    for s, kv_len in enumerate(batch.kv_lens):
        rows = slice(batch.qo_indptr[s], batch.qo_indptr[s + 1])
        pages = index[batch.kv_indptr[s] : batch.kv_indptr[s + 1]]
        k = k_blocks.index_select(1, pages).reshape(kv_heads, -1, head_dim)[:, :kv_len]
        v = v_blocks.index_select(1, pages).reshape(kv_heads, -1, head_dim)[:, :kv_len]
        qs = q[rows].transpose(0, 1)  # (H, n, hd)
        n = qs.shape[1]
        allowed = (
            torch.arange(kv_len, device=q.device)[None, :]
            <= torch.arange(kv_len - n, kv_len, device=q.device)[:, None]
        )
        o = F.scaled_dot_product_attention(
            qs[None], k[None], v[None], attn_mask=allowed, enable_gqa=True
        )
        out[rows] = o[0].transpose(0, 1)
    return out


class FlashInferKernel:
    """FlashInfer's paged attention, planned once a step: its batch decode wrapper when every
    sequence has one query (the decode step, with tensor cores for GQA), its batch prefill
    wrapper otherwise (chunked prefill and decodes mixed; causal from the end of each
    sequence, as the reference). `flashinfer` is the module (a fake in CPU tests)."""

    def __init__(self, flashinfer: Any, device: torch.device, *, block_size: int) -> None:
        self.flashinfer = flashinfer
        self.device = device
        self.block_size = block_size
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "HND", use_tensor_cores=True
        )
        self.prefill: Any = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND")
        self._wrapper: Any = None

    def for_graph(self, size: int, max_pages: int) -> FlashInferKernel:
        """FlashInfer's decode wrapper in its CUDA-graph mode: its page table in buffers of
        fixed size that `plan` fills before each replay (the workspace is shared, as in vLLM)."""

        def i32(n: int) -> torch.Tensor:
            return torch.empty(n, dtype=torch.int32, device=self.device)

        kernel = copy.copy(self)
        kernel.decode = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "HND",
            use_tensor_cores=True,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=i32(size + 1),
            paged_kv_indices_buffer=i32(size * max_pages),
            paged_kv_last_page_len_buffer=i32(size),
        )
        kernel.prefill = None  # a captured step decodes only
        return kernel

    def plan(
        self,
        batch: PagedBatch,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        def i32(values: list[int]) -> torch.Tensor:  # on the host: FlashInfer plans there
            return torch.tensor(values, dtype=torch.int32)

        kv = (i32(batch.kv_indptr), i32(batch.kv_indices), i32(batch.kv_last_page_len))
        if batch.decode_only:
            self._wrapper = self.decode
            self.decode.plan(
                *kv,
                num_heads,
                num_kv_heads,
                head_dim,
                self.block_size,
                q_data_type=dtype,
                kv_data_type=dtype,
            )
        else:
            self._wrapper = self.prefill
            self.prefill.plan(
                i32(batch.qo_indptr),
                *kv,
                num_heads,
                num_kv_heads,
                head_dim,
                self.block_size,
                causal=True,
                q_data_type=dtype,
                kv_data_type=dtype,
            )

    def attend(
        self, q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor
    ) -> torch.Tensor:
        assert self._wrapper is not None, "plan the step first"
        # (KVH, blocks, bs, hd) viewed as (blocks, KVH, bs, hd): FlashInfer's HND, strided.
        cache = (k_blocks.transpose(0, 1), v_blocks.transpose(0, 1))
        return self._wrapper.run(q.contiguous(), cache)


def load_flashinfer() -> Any | None:
    """The `flashinfer` module, or None where it is not installed (logged)."""
    try:
        return importlib.import_module("flashinfer")
    except Exception as error:  # not installed, or built for another torch/CUDA
        log.info("FlashInfer is not available (%s): attention gathers blocks for SDPA", error)
        return None


def kernel_for(
    device: torch.device, *, block_size: int, head_dim: int, choice: str = "auto"
) -> Any | None:
    """The paged kernel the runner uses on `device`: `choice` "auto" takes FlashInfer on CUDA
    where it imports and serves the head size, none elsewhere (the CPU keeps its own decode
    kernel); "reference" forces the reference; "none" none; "flashinfer" requires it."""
    if choice == "none":
        return None
    if choice == "reference":
        return ReferenceKernel()
    if choice not in ("auto", "flashinfer"):
        raise ValueError(f"unknown attention kernel {choice!r} (auto, flashinfer, reference, none)")
    if device.type != "cuda":
        if choice == "flashinfer":
            raise ValueError("the FlashInfer kernel runs on CUDA only")
        return None
    if head_dim not in FLASHINFER_HEAD_DIMS:
        if choice == "flashinfer":
            raise ValueError(f"FlashInfer serves head sizes {FLASHINFER_HEAD_DIMS}, not {head_dim}")
        log.info("head size %d: attention gathers blocks for SDPA", head_dim)
        return None
    module = load_flashinfer()
    if module is None:
        if choice == "flashinfer":
            raise ValueError("--attention flashinfer: the flashinfer package does not import")
        return None
    return FlashInferKernel(module, device, block_size=block_size)
