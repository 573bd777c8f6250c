"""Decode steps through captured graphs (decode_graphs.py), on the CPU: everything but the CUDA
capture, which `FakeGraphCapture` replaces (it runs the captured step where a graph would replay
it: the same closure over the same static buffers, so what reaches the step is only what the
buffers hold, as in a graph)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.core.decode_graphs import capture_sizes, padded_size
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.model_runner import ModelRunner, StepInput

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK = 4
MAX_LEN = 48


class FakeGraphCapture:
    """Stands in for CUDA graph capture: records each captured size's step, replays it eager;
    sizes in `fail` raise at capture, as a capture that is impossible does."""

    def __init__(self, fail: set[int] | None = None) -> None:
        self.fail = fail or set()
        self.captured: list[int] = []
        self.replays: Counter[int] = Counter()

    def __call__(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        size = step().shape[0]  # the capture runs the step once, as the warm-up does
        if size in self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captured.append(size)

        def replay() -> torch.Tensor:
            self.replays[size] += 1
            return step()

        return replay


def test_the_size_table_pads_by_fewer_than_eight_rows() -> None:
    assert capture_sizes(256)[:5] == (1, 2, 4, 8, 16) and capture_sizes(256)[-1] == 256
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert capture_sizes(3) == (1, 2, 3)
    sizes = capture_sizes(64)
    assert [padded_size(n, sizes) for n in (1, 3, 5, 9, 63, 64, 65)] == [1, 4, 8, 16, 64, 64, None]
    with pytest.raises(ValueError, match="at least 1"):
        capture_sizes(0)


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return ensure_builtin("tiny")


def runner_for(path: Path) -> ModelRunner:
    probe = ModelConfig.from_file(path / "config.json")
    return ModelRunner.from_source(
        str(path),
        kv_cache_bytes=64 * BLOCK * probe.kv_bytes_per_token(4),
        block_size=BLOCK,
        max_model_len=MAX_LEN,
    )


def run_both(plain: ModelRunner, graphed: ModelRunner, sequences: int, decodes: int) -> None:
    """`sequences` prompts prefilled, then `decodes` steps decoding all of them at once (blocks
    shuffled): the graphed runner's logits are the plain one's at every step."""
    rng = random.Random(sequences)
    free = list(range(plain.num_blocks))
    rng.shuffle(free)
    per = MAX_LEN // BLOCK
    tables = [free[i * per : (i + 1) * per] for i in range(sequences)]
    lengths = [rng.randrange(3, 20) for _ in range(sequences)]
    prompts = [[rng.randrange(1, 200) for _ in range(n)] for n in lengths]
    step = [StepInput(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
    torch.testing.assert_close(graphed.forward(step), plain.forward(step), rtol=0, atol=1e-5)
    for _ in range(decodes):
        step = [
            StepInput([rng.randrange(1, 200)], n, t) for n, t in zip(lengths, tables, strict=True)
        ]
        torch.testing.assert_close(graphed.forward(step), plain.forward(step), rtol=0, atol=1e-5)
        lengths = [n + 1 for n in lengths]


def test_decode_steps_replay_the_graph_of_the_nearest_size(tiny_dir: Path) -> None:
    plain, graphed = runner_for(tiny_dir), runner_for(tiny_dir)
    capture = FakeGraphCapture()
    assert graphed.capture_decode_graphs(8, capture) == (1, 2, 4, 8)
    assert capture.captured == [8, 4, 2, 1]  # largest first: the others share its memory
    run_both(plain, graphed, sequences=3, decodes=3)
    assert capture.replays == Counter({4: 3})  # 3 rows padded to 4; the prefill ran eager
    run_both(plain, graphed, sequences=5, decodes=2)
    assert capture.replays[8] == 2
    # The padded rows wrote only the scratch block, which no sequence owns.
    assert graphed.scratch_block == graphed.num_blocks


def test_more_rows_than_the_largest_graph_run_eager(tiny_dir: Path) -> None:
    plain, graphed = runner_for(tiny_dir), runner_for(tiny_dir)
    capture = FakeGraphCapture()
    graphed.capture_decode_graphs(2, capture)
    run_both(plain, graphed, sequences=3, decodes=2)
    assert not capture.replays


def test_a_size_that_fails_to_capture_pads_to_a_larger_one(tiny_dir: Path) -> None:
    plain, graphed = runner_for(tiny_dir), runner_for(tiny_dir)
    capture = FakeGraphCapture(fail={4})
    assert graphed.capture_decode_graphs(8, capture) == (1, 2, 8)
    run_both(plain, graphed, sequences=3, decodes=2)
    assert capture.replays == Counter({8: 2})


def test_when_no_size_captures_every_step_runs_eager(tiny_dir: Path) -> None:
    plain, graphed = runner_for(tiny_dir), runner_for(tiny_dir)
    assert graphed.capture_decode_graphs(4, FakeGraphCapture(fail={1, 2, 4})) == ()
    assert graphed.decode_graphs is None
    run_both(plain, graphed, sequences=2, decodes=2)


def test_a_paged_kernel_is_planned_before_each_replay(tiny_dir: Path) -> None:
    plain, graphed = runner_for(tiny_dir), runner_for(tiny_dir)
    assert graphed.use_attention_kernel("reference")
    capture = FakeGraphCapture()
    graphed.capture_decode_graphs(4, capture)
    run_both(plain, graphed, sequences=3, decodes=3)
    assert capture.replays == Counter({4: 3})
    assert graphed.decode_graphs is not None
    planned = graphed.decode_graphs.kernels[4].batch  # the last replay's: 3 rows and a pad
    assert planned is not None and planned.kv_indices[-1] == graphed.scratch_block


def test_the_cpu_decode_kernel_reads_the_graphs_padded_tables(tiny_dir: Path) -> None:
    """The CPU's decode kernel (paged_decode.py) takes each row's table at the buffers' full
    width and its length, no mask."""
    from wok_runtime.kernels import paged_decode

    plain, graphed = runner_for(tiny_dir), runner_for(tiny_dir)
    graphed.decode_kernel = paged_decode.load()
    assert graphed.decode_kernel is not None, "the C++ toolchain that --compile needs"
    capture = FakeGraphCapture()
    graphed.capture_decode_graphs(4, capture)
    run_both(plain, graphed, sequences=3, decodes=2)
    assert capture.replays == Counter({4: 2})


def test_flashinfer_runs_in_its_graph_mode_inside_the_graphs(tiny_dir: Path) -> None:
    """Each size's kernel is FlashInfer's decode wrapper in CUDA-graph mode, its page table in
    buffers of that size (through the fake `flashinfer` of test_paged_attention.py)."""
    from test_paged_attention import FakeFlashInfer

    from wok_runtime.core.paged_attention import FlashInferKernel

    plain, graphed = runner_for(tiny_dir), runner_for(tiny_dir)
    graphed.paged_kernel = FlashInferKernel(FakeFlashInfer, graphed.device, block_size=BLOCK)
    capture = FakeGraphCapture()
    graphed.capture_decode_graphs(4, capture)
    run_both(plain, graphed, sequences=3, decodes=2)
    assert capture.replays == Counter({4: 2})
    assert graphed.decode_graphs is not None
    kernel = graphed.decode_graphs.kernels[4]
    assert isinstance(kernel, FlashInferKernel) and kernel.prefill is None
    options = kernel.decode.options
    assert options["use_cuda_graph"] is True
    assert options["paged_kv_indptr_buffer"].shape == (5,)
    assert options["paged_kv_indices_buffer"].shape == (4 * MAX_LEN // BLOCK,)
    assert options["paged_kv_last_page_len_buffer"].dtype == torch.int32
    # Planned before each replay (and once at capture), every time as a decode of 4 rows.
    assert len(kernel.decode.plans) == 3 and kernel.workspace is graphed.paged_kernel.workspace


def test_without_cuda_nothing_is_captured_and_bad_input_is_still_rejected(
    tiny_dir: Path,
) -> None:
    runner = runner_for(tiny_dir)
    assert runner.capture_decode_graphs() == () and runner.decode_graphs is None
    runner.capture_decode_graphs(4, FakeGraphCapture())
    with pytest.raises(ValueError, match="outside"):
        runner.forward([StepInput([1], 0, [runner.num_blocks])])  # the scratch block is no one's
    with pytest.raises(ValueError, match="exceed max_model_len"):
        runner.forward([StepInput([1], MAX_LEN, list(range(MAX_LEN // BLOCK + 1)))])


def test_serve_flags_choose_the_kernel_and_the_graphs(tiny_dir: Path) -> None:
    from wok.cli import build_parser
    from wok_runtime.core.paged_attention import ReferenceKernel
    from wok_runtime.http.serve import _build_runner

    argv = ["runtime", "serve", "--model", str(tiny_dir), "--device", "cpu"]
    argv += ["--kv-cache-bytes", str(1 << 20), "--attention", "reference", "--cuda-graphs"]
    args = build_parser().parse_args(argv)
    assert args.cuda_graphs and args.attention == "reference"
    runner = _build_runner(args)
    assert isinstance(runner.paged_kernel, ReferenceKernel)
    assert runner.decode_graphs is None  # no CUDA here: every step runs as launched
    default = build_parser().parse_args(argv[:6])
    assert default.attention == "auto" and not default.cuda_graphs
