"""Tensor parallelism on the CPU: two processes over gloo compute what one does.

Rank 0 is the runner the engine would drive; it spawns rank 1 and sends it every step. Greedy
tokens must be the same as with one process, for Llama's shape (builtin:tiny) and for Qwen2's
(whose Q/K/V biases are split with their rows).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from test_model_families import SHAPE, build_hf_dir
from test_model_runner import BLOCK, generate_paged, prompts

from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.model_runner import ModelRunner, StepInput

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCKS = 128


def runner(path: Path, size: int) -> ModelRunner:
    per_token = ModelConfig.from_file(path / "config.json").kv_bytes_per_token(4)
    return ModelRunner.from_source(
        str(path),
        device="cpu",
        kv_cache_bytes=BLOCKS * BLOCK * per_token,
        block_size=BLOCK,
        tensor_parallel_size=size,
    )


def check_tp2_equals_tp1(path: Path, lengths: list[int], steps: int) -> None:
    one = runner(path, 1)
    ids = prompts(one.config.vocab_size, lengths)
    want, want_logits = generate_paged(one, ids, steps, chunk=8)
    two = runner(path, 2)
    try:
        c = two.config
        assert two.num_blocks == one.num_blocks == BLOCKS
        # The pool's bytes (the pod's budget) are split: each rank holds half.
        assert 2 * two.k_blocks.numel() == one.k_blocks.numel()
        # Rank 0 holds half the KV heads and half of every split projection.
        assert two.k_blocks.shape[1] == c.num_key_value_heads // 2
        attn = two.model.layers[0].self_attn
        assert (
            attn.qkv_proj.weight.shape[0] * 2
            == one.model.layers[0].self_attn.qkv_proj.weight.shape[0]
        )
        assert attn.o_proj.weight.shape == (c.hidden_size, c.num_attention_heads * c.head_dim // 2)
        got, got_logits = generate_paged(two, ids, steps, chunk=8)
        assert got == want
        for a, b in zip(got_logits, want_logits, strict=True):
            torch.testing.assert_close(torch.stack(a), torch.stack(b), rtol=0, atol=1e-4)
    finally:
        workers = list(two.workers)
        two.close()
    assert workers and all(not w.is_alive() and w.exitcode == 0 for w in workers)


def test_tp2_is_greedy_equal_to_tp1_for_llama() -> None:
    check_tp2_equals_tp1(ensure_builtin("tiny"), [21, 3, 40], steps=12)


def test_tp2_is_greedy_equal_to_tp1_for_qwen2(tmp_path: Path) -> None:
    path = build_hf_dir(transformers.Qwen2Config(**SHAPE), tmp_path / "qwen2")
    check_tp2_equals_tp1(path, [30, 5], steps=12)


def test_heads_that_do_not_split_are_refused_before_any_rank_starts() -> None:
    with pytest.raises(ValueError, match=r"num_attention_heads \(8\) to be a multiple of 3"):
        runner(ensure_builtin("tiny"), 3)


def test_a_step_after_a_rank_died_fails_instead_of_waiting_for_it() -> None:
    two = runner(ensure_builtin("tiny"), 2)
    ids = prompts(two.config.vocab_size, [5])[0]
    (worker,) = two.workers
    worker.kill()
    worker.join(timeout=30)
    with pytest.raises(RuntimeError, match="a tensor-parallel rank exited"):
        two.forward([StepInput(ids, 0, [0, 1])])
    torch.distributed.destroy_process_group()
