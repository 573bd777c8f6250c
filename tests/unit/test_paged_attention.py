"""The paged attention interface (paged_attention.py): the CSR description of a step, the
reference kernel against the runner's own attention, and FlashInfer's adapter driven through a
fake of the `flashinfer` module (FlashInfer runs on CUDA only; the fake computes with the
reference from exactly the arguments the adapter hands FlashInfer)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from wok_runtime.core import paged_attention
from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.model_runner import ModelRunner, StepInput
from wok_runtime.core.paged_attention import (
    FlashInferKernel,
    PagedBatch,
    ReferenceKernel,
    kernel_for,
    paged_batch,
    reference_attention,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK = 4


def test_paged_batch_names_only_the_pages_that_hold_keys() -> None:
    batch = paged_batch([1, 3], [5, 8], [[7, 2, 9], [4, 1]], BLOCK)
    assert batch.qo_indptr == [0, 1, 4]
    assert batch.kv_indptr == [0, 2, 4]
    assert batch.kv_indices == [7, 2, 4, 1]
    assert batch.kv_last_page_len == [1, 4]
    assert not batch.decode_only
    assert paged_batch([1, 1], [5, 8], [[7, 2], [4, 1]], BLOCK).decode_only


def test_paged_batch_rejects_what_no_kernel_can_run() -> None:
    with pytest.raises(ValueError, match="do not hold"):
        paged_batch([1], [9], [[0, 1]], BLOCK)
    with pytest.raises(ValueError, match="cannot have"):
        paged_batch([4], [3], [[0]], BLOCK)


def test_reference_attention_is_causal_from_the_end_of_each_sequence() -> None:
    """Against SDPA on the contiguous keys of each sequence, the pages shuffled in the pool."""
    torch.manual_seed(0)
    kvh, heads, hd, n_blocks = 2, 4, 8, 12
    k_blocks = torch.randn(kvh, n_blocks, BLOCK, hd)
    v_blocks = torch.randn(kvh, n_blocks, BLOCK, hd)
    tables, kv_lens, q_lens = [[5, 0, 9], [3, 11]], [10, 6], [3, 1]
    batch = paged_batch(q_lens, kv_lens, tables, BLOCK)
    q = torch.randn(sum(q_lens), heads, hd)
    got = reference_attention(q, k_blocks, v_blocks, batch)
    row = 0
    for table, kv_len, n in zip(tables, kv_lens, q_lens, strict=True):
        k = k_blocks[:, table].reshape(kvh, -1, hd)[:, :kv_len].repeat_interleave(2, 0)
        v = v_blocks[:, table].reshape(kvh, -1, hd)[:, :kv_len].repeat_interleave(2, 0)
        for i in range(n):
            pos = kv_len - n + i
            scores = (q[row + i][:, None, :] @ k[:, : pos + 1].transpose(1, 2))[:, 0] * hd**-0.5
            want = (scores.softmax(-1)[:, None, :] @ v[:, : pos + 1])[:, 0]
            torch.testing.assert_close(got[row + i], want, rtol=1e-5, atol=1e-5)
        row += n


class FakeWrapper:
    """FlashInfer's batch wrapper, computing with the reference from what it was planned with."""

    def __init__(self, workspace: torch.Tensor, layout: str, **options: Any) -> None:
        assert layout == "HND" and workspace.dtype == torch.uint8
        self.options = options
        self.plans: list[dict[str, Any]] = []
        self.batch: PagedBatch | None = None

    def _plan(self, qo: list[int] | None, indptr, indices, last, page_size: int) -> None:
        indptr, indices, last = indptr.tolist(), indices.tolist(), last.tolist()
        counts = [b - a for a, b in itertools.pairwise(indptr)]
        kv_lens = [(c - 1) * page_size + n for c, n in zip(counts, last, strict=True)]
        qo = qo or list(range(len(counts) + 1))
        self.batch = PagedBatch(qo, indptr, indices, last, kv_lens)

    def run(self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        k_cache, v_cache = cache  # (blocks, KVH, bs, hd): HND
        assert self.batch is not None
        return reference_attention(q, k_cache.transpose(0, 1), v_cache.transpose(0, 1), self.batch)


class FakeDecodeWrapper(FakeWrapper):
    def plan(self, indptr, indices, last, heads, kv_heads, hd, page_size, **kw: Any) -> None:
        self.plans.append({"heads": heads, "kv_heads": kv_heads, "head_dim": hd, **kw})
        self._plan(None, indptr, indices, last, page_size)


class FakePrefillWrapper(FakeWrapper):
    def plan(self, qo, indptr, indices, last, heads, kv_heads, hd, page_size, **kw: Any) -> None:
        assert kw.get("causal") is True
        self.plans.append({"heads": heads, "kv_heads": kv_heads, "head_dim": hd, **kw})
        self._plan(qo.tolist(), indptr, indices, last, page_size)


class FakeFlashInfer:
    BatchDecodeWithPagedKVCacheWrapper = FakeDecodeWrapper
    BatchPrefillWithPagedKVCacheWrapper = FakePrefillWrapper


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return ensure_builtin("tiny")


def runner_for(path: Path) -> ModelRunner:
    probe = ModelConfig.from_file(path / "config.json")
    return ModelRunner.from_source(
        str(path), kv_cache_bytes=64 * BLOCK * probe.kv_bytes_per_token(4), block_size=BLOCK
    )


def steps(vocab: int) -> list[list[StepInput]]:
    """Two sequences prefilled, then one decoding while a third prefills in two chunks (with a
    prefix), then every one decoding: each kind of step, blocks shuffled."""
    rng = random.Random(5)
    free = list(range(64))
    rng.shuffle(free)
    tables = [free[0:4], free[4:8], free[8:14]]
    p = [[rng.randrange(1, vocab) for _ in range(n)] for n in (7, 13, 19)]
    return [
        [StepInput(p[0], 0, tables[0]), StepInput(p[1], 0, tables[1])],
        [StepInput([3], 7, tables[0]), StepInput(p[2][:9], 0, tables[2])],
        [
            StepInput([4], 8, tables[0]),
            StepInput([5], 13, tables[1]),
            StepInput(p[2][9:], 9, tables[2]),
        ],
        [
            StepInput([6], 9, tables[0]),
            StepInput([7], 14, tables[1]),
            StepInput([8], 19, tables[2]),
        ],
    ]


@pytest.mark.parametrize("kernel", ["reference", "flashinfer-fake"])
def test_a_paged_kernel_gives_the_runners_own_logits(tiny_dir: Path, kernel: str) -> None:
    plain, paged = runner_for(tiny_dir), runner_for(tiny_dir)
    if kernel == "reference":
        assert paged.use_attention_kernel("reference")
    else:
        paged.paged_kernel = FlashInferKernel(FakeFlashInfer, paged.device, block_size=BLOCK)
    for step in steps(plain.config.vocab_size):
        torch.testing.assert_close(paged.forward(step), plain.forward(step), rtol=0, atol=1e-5)
    if kernel != "reference":
        fi = paged.paged_kernel
        assert isinstance(fi, FlashInferKernel)
        # The last step decodes only (the decode wrapper); the others mix (the prefill one).
        assert len(fi.decode.plans) == 1 and len(fi.prefill.plans) == 3
        c = plain.config
        want = {"heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads}
        assert fi.decode.plans[0] | want == fi.decode.plans[0]
        assert fi.decode.plans[0]["q_data_type"] == torch.float32


def test_the_kernel_choice_by_device() -> None:
    cpu = torch.device("cpu")
    assert kernel_for(cpu, block_size=BLOCK, head_dim=64) is None  # the CPU keeps its decode kernel
    assert isinstance(
        kernel_for(cpu, block_size=BLOCK, head_dim=64, choice="reference"), ReferenceKernel
    )
    assert kernel_for(cpu, block_size=BLOCK, head_dim=64, choice="none") is None
    with pytest.raises(ValueError, match="CUDA only"):
        kernel_for(cpu, block_size=BLOCK, head_dim=64, choice="flashinfer")
    with pytest.raises(ValueError, match="unknown attention kernel"):
        kernel_for(cpu, block_size=BLOCK, head_dim=64, choice="flex")


def test_cuda_without_flashinfer_falls_back_to_the_runners_attention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(paged_attention, "load_flashinfer", lambda: None)
    cuda = torch.device("cuda")
    assert kernel_for(cuda, block_size=BLOCK, head_dim=64) is None
    with pytest.raises(ValueError, match="does not import"):
        kernel_for(cuda, block_size=BLOCK, head_dim=64, choice="flashinfer")


def test_a_head_size_flashinfer_does_not_serve_keeps_the_runners_attention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(paged_attention, "load_flashinfer", lambda: FakeFlashInfer)
    cuda = torch.device("cuda")
    assert kernel_for(cuda, block_size=BLOCK, head_dim=32) is None
    with pytest.raises(ValueError, match="head sizes"):
        kernel_for(cuda, block_size=BLOCK, head_dim=32, choice="flashinfer")
