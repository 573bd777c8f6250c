"""Decode steps replayed from CUDA graphs, one captured per batch size (as vLLM does).

A decode step of a small model on a GPU is mostly the cost of launching its kernels one by one
from Python; a CUDA graph launches the whole step at once. A graph replays fixed tensors, so the
step is captured for a table of batch sizes (`capture_sizes`: 1, 2, 4, then every 8) over static
buffers sized for the largest; a step of n sequences is copied into the first rows of the
buffers, padded to the nearest captured size (`padded_size`), replayed, and its first n rows of
logits returned. Padded rows decode token 0 at position 0 into the runner's scratch block, which
no sequence owns. Each sequence's block table is padded to the longest a sequence can have
(max_model_len), its keys past its length masked.

The capture itself sits behind one seam, `GraphCapture`: `CudaGraphCapture` on a GPU; on the CPU
tests pass a fake that runs the step where a graph would replay, so the padding, the size table,
the buffers and the choice of graph are tested here. Where a size fails to capture it is left
out (logged) and the steps it would have served pad to a larger one or run eager; steps that
are not decode-only or are larger than the largest size run eager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from wok_runtime.core.paged_attention import PagedBatch, PagedKernel, paged_batch

if TYPE_CHECKING:
    from wok_runtime.core.model_runner import ModelRunner, StepInput

log = logging.getLogger(__name__)

#: The largest decode batch captured by default (vLLM captures up to 512; 256 covers the
#: batches a pod's budget allows on the models this project serves, at a fraction of the memory).
MAX_CAPTURED_BATCH = 256


def capture_sizes(max_batch: int = MAX_CAPTURED_BATCH) -> tuple[int, ...]:
    """The batch sizes captured: 1, 2, 4, then every multiple of 8 up to `max_batch` (which is
    included), so a step pads by fewer than 8 rows."""
    if max_batch < 1:
        raise ValueError(f"the largest captured batch must be at least 1, got {max_batch}")
    sizes = [s for s in (1, 2, 4) if s <= max_batch] + list(range(8, max_batch + 1, 8))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return tuple(sizes)


def padded_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size in `sizes` (ascending) that holds n rows; None: none does."""
    return next((s for s in sizes if s >= n), None)


class GraphCapture(Protocol):
    """Captures `step` (which reads and writes only static tensors) and returns what replays
    it, returning the same output tensor each time."""

    def __call__(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]: ...


class CudaGraphCapture:
    """torch.cuda.CUDAGraph: warm-up on a side stream, capture, every graph in one memory pool
    (captured largest first, the smaller ones reuse its memory)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # lazy initialisation (cuBLAS handles, autotuning) happens outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


class DecodeGraphs:
    """The runner's decode steps through captured graphs (see the module's docstring)."""

    def __init__(self, runner: ModelRunner, sizes: Sequence[int], capture: GraphCapture) -> None:
        self.runner = runner
        self.sizes = tuple(sorted(sizes))
        device, bs = runner.device, runner.block_size
        largest = self.sizes[-1]
        self.max_blocks = -(-runner.max_model_len // bs)
        # The buffers of the largest size; size B's graph reads their first B rows.
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.slots = torch.zeros(largest, dtype=torch.long, device=device)
        self.last_rows = torch.arange(largest, device=device)
        self.block_tables = torch.zeros(largest, self.max_blocks, dtype=torch.long, device=device)
        self.lengths = torch.ones(largest, dtype=torch.long, device=device)
        keys = self.max_blocks * bs
        self.mask = torch.zeros(largest, 1, 1, keys, dtype=runner.dtype, device=device)
        self._keys = torch.arange(keys, device=device)
        self.graphs: dict[int, Callable[[], torch.Tensor]] = {}
        # The paged kernel's graph form per size (FlashInfer's, planned before each replay).
        self.kernels: dict[int, PagedKernel] = {}
        self._pad()
        for size in reversed(self.sizes):  # largest first: the smaller share its memory
            try:
                self.graphs[size] = capture(self._step_for(size))
            except Exception:
                log.warning(
                    "capturing the decode step of %d rows failed; it runs eager",
                    size,
                    exc_info=True,
                )
        self.captured = tuple(s for s in self.sizes if s in self.graphs)

    def _step_for(self, size: int) -> Callable[[], torch.Tensor]:
        runner = self.runner
        plan = runner.static_decode_plan(
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            slots=self.slots[:size],
            last_rows=self.last_rows[:size],
            block_tables=self.block_tables[:size],
            lengths=self.lengths[:size],
            mask=self.mask[:size],
        )
        if runner.paged_kernel is not None:
            kernel = runner.paged_kernel.for_graph(size, self.max_blocks)
            self.kernels[size] = plan.kernel = kernel
            runner.plan_kernel(kernel, self._paged_batch(size, [], []))  # all rows padding
        return lambda: runner.run_plan(plan)

    def _paged_batch(self, size: int, lengths: list[int], tables: list[list[int]]) -> PagedBatch:
        """The `size` rows in the kernel's form: these sequences, then padding."""
        pad = size - len(lengths)
        return paged_batch(
            [1] * size,
            lengths + [1] * pad,
            tables + [[self.runner.scratch_block]] * pad,
            self.runner.block_size,
        )

    def _pad(self, start: int = 0) -> None:
        """Rows from `start` decode token 0 at position 0 into the scratch block."""
        scratch = self.runner.scratch_block
        self.input_ids[start:] = 0
        self.positions[start:] = 0
        self.slots[start:] = scratch * self.runner.block_size
        self.block_tables[start:] = scratch
        self.lengths[start:] = 1

    def run(self, inputs: list[StepInput]) -> torch.Tensor | None:
        """The step's logits (len(inputs), vocab) from a graph; None where no graph serves it
        (not decode-only, or more rows than the largest captured size): run it eager."""
        if not inputs or any(len(x.token_ids) != 1 for x in inputs):
            return None
        n = len(inputs)
        size = padded_size(n, self.captured)
        if size is None:
            return None
        runner, bs = self.runner, self.runner.block_size
        for x in inputs:
            runner.check_input(x)
        tables = torch.full((n, self.max_blocks), runner.scratch_block, dtype=torch.long)
        for row, x in enumerate(inputs):
            tables[row, : len(x.block_table)] = torch.tensor(x.block_table[: self.max_blocks])
        positions = torch.tensor([x.start_pos for x in inputs])
        self.input_ids[:n].copy_(torch.tensor([x.token_ids[0] for x in inputs]))
        self.positions[:n].copy_(positions)
        rows = torch.arange(n)
        self.slots[:n].copy_(tables[rows, positions // bs] * bs + positions % bs)
        self.block_tables[:n].copy_(tables)
        self.lengths[:n].copy_(positions + 1)
        self._pad(n)
        if runner.paged_kernel is None and runner.decode_kernel is None:  # SDPA reads the mask
            allowed = self._keys[None, :] < self.lengths[:size, None]  # (size, keys)
            additive = torch.zeros(allowed.shape, dtype=self.mask.dtype, device=allowed.device)
            self.mask[:size, 0, 0].copy_(additive.masked_fill_(~allowed, float("-inf")))
        kernel = self.kernels.get(size)
        if kernel is not None:
            batch = self._paged_batch(
                size, [x.start_pos + 1 for x in inputs], [x.block_table for x in inputs]
            )
            runner.plan_kernel(kernel, batch)
        return self.graphs[size]()[:n]
