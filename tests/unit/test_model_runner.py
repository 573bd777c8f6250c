"""The paged ModelRunner computes what Hugging Face's LlamaForCausalLM computes.

The reference is `transformers` itself, loaded from the directory wok writes (fp32, eager
attention): prefill, chunked prefill and step-by-step paged decode, mixed in one batch, must give
the same logits (≤ 1e-4) and the same greedy tokens, for an untied model (builtin:tiny) and a
tied one with SmolLM2's head layout (a smaller copy; the exact 135M shape is one slow test).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from wok_runtime.core.builtin import BuiltinSpec, ensure_builtin, ensure_generated
from wok_runtime.core.host_memory import CPU_KV_CAP_BYTES, CPU_KV_FRACTION, available_bytes
from wok_runtime.core.loader import load_model
from wok_runtime.core.model import (
    FP32_GEMM_MIN_ROWS,
    CausalAttention,
    Linear,
)
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.model_runner import ModelRunner, StepInput
from wok_runtime.kernels import brgemm_linear

pytestmark = pytest.mark.usefixtures("one_torch_thread")


BLOCK = 4  # small blocks, so every sequence spans several of them
TOL = 1e-4

# SmolLM2's layout (tied embeddings, 3:1 GQA, head_dim 64, rope_theta 1e5), scaled down.
TIED_SMALL = BuiltinSpec(
    name="tied-small",
    seed=7,
    config=ModelConfig(
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=64,
        vocab_size=4096,
        rope_theta=100000.0,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    ),
)


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return ensure_builtin("tiny")


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_generated(TIED_SMALL, tmp_path_factory.mktemp("models"))


def hf_model(path: Path):
    # Auto: the class the config's model_type names (Llama, Mistral, Qwen2, Qwen3).
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()


@torch.inference_mode()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits at every position of one unpadded sequence: (len(ids), vocab)."""
    return model(torch.tensor([ids])).logits[0].float()


def runner_for(path: Path, blocks: int = 256, *, compile: bool = False) -> ModelRunner:
    probe = ModelConfig.from_file(path / "config.json")
    return ModelRunner.from_source(
        str(path),
        kv_cache_bytes=blocks * BLOCK * probe.kv_bytes_per_token(4),
        block_size=BLOCK,
        compile=compile,
    )


class Pool:
    """Hands out blocks in a shuffled order, so no sequence gets contiguous blocks."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.free = list(range(n))
        random.Random(seed).shuffle(self.free)

    def grow(self, table: list[int], length: int) -> list[int]:
        while len(table) * BLOCK < length:
            table.append(self.free.pop())
        return table


def prompts(vocab: int, lengths: list[int], seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]


def generate_paged(
    runner: ModelRunner, prompt_ids: list[list[int]], steps: int, *, chunk: int
) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Greedy generation through ModelRunner.forward, continuous-batching style: sequence 0
    prefills in one step; the others prefill in chunks of `chunk` tokens while earlier sequences
    already decode in the same steps. Returns each sequence's tokens and, per generated token,
    the logits it was chosen from."""
    pool = Pool(runner.num_blocks)
    seqs = [list(p) for p in prompt_ids]
    tables: list[list[int]] = [[] for _ in seqs]
    done = [0] * len(seqs)  # tokens whose K/V are in the cache
    logits: list[list[torch.Tensor]] = [[] for _ in seqs]
    admitted = 1
    while any(len(lg) < steps for lg in logits):
        batch, owners = [], []
        for i in range(admitted):
            if len(logits[i]) >= steps:
                continue
            n = len(seqs[i]) - done[i]
            if n > 1 and i > 0:
                n = min(n, chunk)
            start = done[i]
            pool.grow(tables[i], start + n)
            batch.append(StepInput(seqs[i][start : start + n], start, list(tables[i])))
            owners.append(i)
        out = runner.forward(batch)
        assert out.shape == (len(batch), runner.config.vocab_size)
        assert out.dtype == torch.float32
        for row, i in enumerate(owners):
            done[i] += len(batch[row].token_ids)
            if done[i] == len(seqs[i]):  # the prompt (or last token) is fully in: sample
                logits[i].append(out[row])
                seqs[i].append(int(out[row].argmax()))
        admitted = min(len(seqs), admitted + 1)
    return seqs, logits


def check_against_hf(
    path: Path,
    lengths: list[int],
    steps: int,
    chunk: int,
    *,
    tol: float = TOL,
    compile: bool = False,
) -> ModelRunner:
    runner = runner_for(path, compile=compile)
    ref = hf_model(path)
    ids = prompts(runner.config.vocab_size, lengths)

    # 1. All prompts prefilled in one packed step: last-token logits.
    pool = Pool(runner.num_blocks, seed=3)
    step = [StepInput(p, 0, pool.grow([], len(p))) for p in ids]
    out = runner.forward(step)
    for row, p in enumerate(ids):
        torch.testing.assert_close(out[row], hf_logits(ref, p)[-1], rtol=0, atol=tol)

    # 2. Chunked prefill and paged decode, mixed in the same steps.
    seqs, logits = generate_paged(runner, ids, steps, chunk=chunk)
    for i, seq in enumerate(seqs):
        full = hf_logits(ref, seq)  # teacher-forced on our tokens
        prompt_len = len(ids[i])
        for t, got in enumerate(logits[i]):
            want = full[prompt_len - 1 + t]
            torch.testing.assert_close(got, want, rtol=0, atol=tol)
            # HF's greedy choice at every step is our token, so HF's greedy decode is ours.
            assert int(want.argmax()) == seq[prompt_len + t]
    return runner


def test_untied_tiny_matches_transformers(tiny_dir: Path) -> None:
    check_against_hf(tiny_dir, lengths=[13, 1, 30, 7], steps=32, chunk=5)


def test_tied_small_matches_transformers(tied_dir: Path) -> None:
    check_against_hf(tied_dir, lengths=[9, 21, 2], steps=32, chunk=4)


def test_the_compiled_tiny_matches_transformers(tiny_dir: Path) -> None:
    """The whole step as one graph (prefills, chunks, decodes of one and of several, mixed) and
    the decode attention kernel compute what Hugging Face does, greedy token for greedy token;
    every step's shape runs on the one graph compiled at start."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the graph count
    runner = check_against_hf(tiny_dir, lengths=[40, 1, 30, 7], steps=24, chunk=5, compile=True)
    assert runner.decode_kernel is not None  # the decodes ran on paged_decode's kernel
    assert runner.step_graph is not None
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_compiled_bf16_runner_on_oneDNN_weights_runs_one_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where brgemm cannot be built, a compiled bf16 step runs its linears on oneDNN's prepacked
    weights (on a CPU with AMX; on fp32 copies or plain weights without): one graph for steps
    of every size, and the eager runner's logits."""
    monkeypatch.setattr(brgemm_linear, "load", lambda: False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the graph count

    def runner(compile: bool) -> ModelRunner:
        return ModelRunner.from_source(
            "builtin:tiny", kv_cache_bytes=1 << 22, dtype="bfloat16", compile=compile
        )

    compiled, eager = runner(True), runner(False)
    assert compiled.step_graph is not None
    assert all(m.brgemm_packed is None for m in compiled.model.linears())
    for n in (1, 5, 40):
        for step in (
            [StepInput(list(range(10, 10 + n)), 0, [0, 1, 2])],
            [StepInput([7], n, [0, 1, 2]), StepInput([8], 3, [3])],
        ):
            got, want = compiled.forward(step), eager.forward(step)
            torch.testing.assert_close(got, want, rtol=0, atol=0.05)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_model_that_fails_to_compile_runs_eager(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_compile(fn, **_):  # a compiler that cannot build (no C++ toolchain, say)
        def broken(*args, **kwargs):
            raise RuntimeError("fake compiler: no toolchain")

        return broken

    monkeypatch.setattr(torch, "compile", fake_compile)
    runner = runner_for(tiny_dir)
    assert not runner.compile()
    assert runner.step_graph is None
    ids = prompts(runner.config.vocab_size, [5])[0]
    assert runner.forward([StepInput(ids, 0, [0, 1])]).isfinite().all()


@pytest.mark.slow
def test_smollm2_135m_shape_matches_transformers() -> None:
    check_against_hf(ensure_builtin("smollm2-135m"), lengths=[17, 5], steps=8, chunk=6)


def test_reused_blocks_do_not_leak_old_keys(tiny_dir: Path) -> None:
    """A sequence that gets another one's freed blocks sees none of its K/V (masking of the
    unwritten tail of a block, and of padded blocks in a decode batch)."""
    runner = runner_for(tiny_dir, blocks=16)
    ref = hf_model(tiny_dir)
    a, b, c = prompts(runner.config.vocab_size, [23, 6, 3], seed=5)
    runner.forward([StepInput(a, 0, list(range(6)))])  # fills blocks 0..5
    # b reuses block 4 and 2, c reuses 5; decode both in one padded batch.
    runner.forward([StepInput(b[:-1], 0, [4, 2]), StepInput(c[:-1], 0, [5])])
    out = runner.forward([StepInput(b[-1:], 5, [4, 2]), StepInput(c[-1:], 2, [5])])
    torch.testing.assert_close(out[0], hf_logits(ref, b)[-1], rtol=0, atol=TOL)
    torch.testing.assert_close(out[1], hf_logits(ref, c)[-1], rtol=0, atol=TOL)


def test_kv_pool_is_sized_from_the_budget(tiny_dir: Path) -> None:
    config = ModelConfig.from_file(tiny_dir / "config.json")
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    runner = ModelRunner.from_source(
        "builtin:tiny", kv_cache_bytes=10 * 16 * per_token + 123, block_size=16
    )
    assert runner.kv_bytes_per_token == per_token
    assert (runner.num_blocks, runner.block_size) == (10, 16)
    # The budget's blocks, and the scratch block that padded rows of a decode graph write.
    assert runner.k_blocks.numel() * 4 * 2 == (10 + 1) * 16 * per_token
    assert runner.scratch_block == 10
    assert runner.device == torch.device("cpu")
    assert runner.dtype == torch.float32
    assert runner.max_model_len == config.max_position_embeddings
    assert runner.tokenizer.eos_token_id == config.eos_token_id == 0


def test_without_a_kv_budget_the_cpu_pool_takes_the_default_share_of_free_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("INFO", logger="wok_runtime.core.model_runner"):
        runner = ModelRunner.from_source("builtin:tiny", device="cpu")
    kv = runner.kv_memory
    assert kv is not None and kv.device == "cpu"
    assert kv.budget_bytes == kv.measured_bytes  # it took what it measured
    assert 0 < kv.budget_bytes <= CPU_KV_CAP_BYTES
    if kv.budget_bytes < CPU_KV_CAP_BYTES:  # else the cap; free memory moves a little
        assert kv.budget_bytes <= available_bytes() * CPU_KV_FRACTION * 1.5
    pool = runner.num_blocks * runner.block_size * runner.kv_bytes_per_token
    assert kv.budget_bytes - runner.block_size * runner.kv_bytes_per_token < pool
    assert pool <= kv.budget_bytes
    (line,) = [r.getMessage() for r in caplog.records if "KV cache on cpu" in r.getMessage()]
    assert "--kv-cache-bytes" in line and "available host memory" in line


def test_bad_configuration_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="holds no block"):
        ModelRunner.from_source("builtin:tiny", kv_cache_bytes=100)
    with pytest.raises(ValueError, match="unsupported dtype"):
        ModelRunner.from_source("builtin:tiny", kv_cache_bytes=1 << 20, dtype="float8")
    with pytest.raises(ValueError, match="max_model_len"):
        ModelRunner.from_source("builtin:tiny", kv_cache_bytes=1 << 20, max_model_len=10**6)
    with pytest.raises(ValueError, match="unknown built-in model"):
        ModelRunner.from_source("builtin:nope", kv_cache_bytes=1 << 20)
    with pytest.raises(ValueError, match="neither builtin"):
        ModelRunner.from_source("/nonexistent/model", kv_cache_bytes=1 << 20)


def test_bad_step_inputs_are_rejected(tiny_dir: Path) -> None:
    runner = runner_for(tiny_dir, blocks=8)
    with pytest.raises(ValueError, match="does not cover"):
        runner.forward([StepInput([1, 2, 3, 4, 5], 0, [0])])
    with pytest.raises(ValueError, match="outside"):
        runner.forward([StepInput([1], 0, [8])])
    with pytest.raises(ValueError, match="no tokens"):
        runner.forward([StepInput([], 0, [0])])
    assert runner.forward([]).shape == (0, runner.config.vocab_size)


def test_bfloat16_runs_close_to_float32(tiny_dir: Path) -> None:
    """Low precision is for GPUs, but the path must work anywhere: same argmax, close logits."""
    ids = prompts(8192, [11])[0]
    outs = []
    for dtype in ("float32", "bfloat16"):
        runner = ModelRunner.from_source(
            "builtin:tiny", kv_cache_bytes=1 << 20, dtype=dtype, block_size=BLOCK
        )
        assert runner.kv_bytes_per_token == runner.config.kv_bytes_per_token(
            2 if dtype == "bfloat16" else 4
        )
        outs.append(runner.forward([StepInput(ids, 0, [0, 1, 2])])[0])
    assert outs[1].dtype == torch.float32
    assert (outs[0] - outs[1]).abs().max() < 0.1


def random_bf16_linear() -> Linear:
    """A 64 -> 48 bfloat16 linear with a bias, random weights (its init is left empty)."""
    torch.manual_seed(0)
    linear = Linear(64, 48, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64))
        linear.bias.copy_(torch.randn(48))
    return linear.bfloat16()


def test_bfloat16_linears_of_many_rows_run_the_same_sums_on_fp32_copies() -> None:
    """The fp32 copies change the kernel, not the sums: from FP32_GEMM_MIN_ROWS rows a linear
    computes the fp32 product of its bf16 inputs and weights, rounded once; below, bf16's."""
    linear = random_bf16_linear()
    linear.keep_fp32_copy()
    w, b = linear.weight.float(), linear.bias.float()
    many = torch.randn(FP32_GEMM_MIN_ROWS, 64).bfloat16()
    assert torch.equal(linear(many), F.linear(many.float(), w, b).bfloat16())
    few = many[: FP32_GEMM_MIN_ROWS - 1]
    assert torch.equal(linear(few), F.linear(few, linear.weight, linear.bias))


def test_a_prepacked_linear_computes_what_the_plain_one_does() -> None:
    """Packing changes the weight's layout, not the sums (bias included); the plain weight goes,
    unless it is kept for a tied embedding."""
    linear = random_bf16_linear()
    weight = linear.weight.detach().clone()
    for rows in (1, 7, 32, 100):
        x = torch.randn(rows, 64).bfloat16()
        expected = F.linear(x, weight, linear.bias)
        packed = Linear(64, 48, bias=True).bfloat16()
        packed.load_state_dict(linear.state_dict())
        packed.pack()
        assert packed.weight.numel() == 0
        assert torch.equal(packed(x), expected)
    tied = Linear(64, 48).bfloat16()
    tied.pack(keep_weight=True)
    assert tied.weight.shape == (48, 64)


def test_a_bfloat16_cpu_runner_prepares_its_gemms_and_matches_the_plain_model(
    tiny_dir: Path,
) -> None:
    """With AMX every linear is prepacked, without it the large GEMMs get fp32 copies; either
    way the runner's logits are the plain bf16 model's (a prefill long enough for the copies)."""
    runner = ModelRunner.from_source(
        "builtin:tiny", kv_cache_bytes=1 << 20, dtype="bfloat16", block_size=BLOCK
    )
    linears = runner.model.linears()
    if torch.cpu._is_amx_tile_supported():
        assert all(m.packed is not None and m.weight32 is None for m in linears)
    else:
        assert all(m.packed is None and m.weight32 is not None for m in linears)
    ids = prompts(8192, [FP32_GEMM_MIN_ROWS + 8])[0]
    prepared = runner.forward([StepInput(ids, 0, list(range(10)))])[0]
    plain = load_model(tiny_dir, dtype=torch.bfloat16, device=torch.device("cpu"))
    with torch.inference_mode():
        hidden = plain(torch.tensor(ids), torch.arange(len(ids)), CausalAttention())
        reference = plain.logits(hidden[-1:])[0]
    assert prepared.argmax() == reference.argmax()
    assert (prepared - reference).abs().max() < 0.1


def test_decode_batches_of_very_different_lengths_split_into_groups(tiny_dir: Path) -> None:
    """Short and long sequences decode in separate padded groups; results still match HF."""
    runner = runner_for(tiny_dir)
    ref = hf_model(tiny_dir)
    ids = prompts(runner.config.vocab_size, [2, 150, 3, 161, 1], seed=9)
    pool = Pool(runner.num_blocks, seed=4)
    tables = [pool.grow([], len(p)) for p in ids]
    runner.forward(
        [StepInput(p[:-1], 0, t) for p, t in zip(ids, tables, strict=True) if len(p) > 1]
    )
    step = [StepInput(p[-1:], len(p) - 1, t) for p, t in zip(ids, tables, strict=True)]
    plan = runner._plan(step)
    assert len(plan.decodes) >= 2 and not plan.prefills
    # Masks are made once a step in the form SDPA adds to its scores, not converted per layer.
    masks = [g.mask for g in plan.decodes if g.mask is not None]
    assert masks and all(m.dtype == runner.dtype for m in masks)
    assert all(set(m.unique().tolist()) <= {0.0, float("-inf")} for m in masks)
    out = runner.forward(step)
    for row, p in enumerate(ids):
        torch.testing.assert_close(out[row], hf_logits(ref, p)[-1], rtol=0, atol=TOL)


@pytest.mark.parametrize("seed", range(20))
def test_length_groups_partition_the_rows_and_never_cost_more(seed: int) -> None:
    from wok_runtime.core.model_runner import _GROUP_COST_BLOCKS, _length_groups

    rng = random.Random(seed)
    counts = sorted(rng.randint(1, rng.choice([3, 20, 200])) for _ in range(rng.randint(1, 90)))
    groups = _length_groups(counts)
    assert groups[0][0] == 0 and groups[-1][1] == len(counts)
    assert all(a < b for a, b in groups)
    assert all(groups[i][1] == groups[i + 1][0] for i in range(len(groups) - 1))

    def cost(gs: list[tuple[int, int]]) -> int:
        return sum((b - a) * counts[b - 1] + _GROUP_COST_BLOCKS for a, b in gs)

    if len(set(counts)) <= 64:  # the exact regime: no worse than one group
        assert cost(groups) <= cost([(0, len(counts))])
