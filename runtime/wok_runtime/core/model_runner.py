"""The model runner: the only place where the engine's steps meet torch and the paged KV cache.

The engine hands `forward` a list of `StepInput`s (prefill chunks and single decode tokens of
different sequences, mixed). The runner packs all their tokens into one forward pass: every
matmul runs once over all tokens of the step; only attention is per sequence. K/V live in a pool
of fixed-size blocks per layer; a token at position `p` of a sequence is stored in slot
`block_table[p // block_size] * block_size + p % block_size`.

Everything that depends on the step's shape (slots to write, slots to gather, masks, rows to take
logits from) is computed once per step by `_plan` and reused by all layers, so the per-layer cost
is the same handful of tensor ops whatever the batch.

Under tensor parallelism (`tensor_parallel_size` N > 1, parallel.py) this runner is rank 0: it
spawns ranks 1..N-1, each a runner of its own shard and KV heads, and sends them every step before
running its own part. Block ids and the pool's size in blocks are the same on every rank; the
pool's bytes (`kv_cache_bytes`, the pod's budget) are split between them.
"""

from __future__ import annotations

import itertools
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from wok_runtime.core import paged_attention
from wok_runtime.core.decode_graphs import (
    MAX_CAPTURED_BATCH,
    CudaGraphCapture,
    DecodeGraphs,
    GraphCapture,
    capture_sizes,
)
from wok_runtime.core.host_memory import available_bytes, default_cpu_kv_bytes
from wok_runtime.core.kv_memory import KV_BUDGET_TOLERANCE, KvMemory
from wok_runtime.core.loader import load_model, parse_dtype, resolve_source
from wok_runtime.core.model import FP32_GEMM_MIN_ROWS, CausalAttention, Transformer
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.paged_attention import PagedBatch, PagedKernel, paged_batch
from wok_runtime.core.parallel import (
    Parallel,
    broadcast_step,
    check_divisible,
    free_port,
    join_group,
    leave_group,
    rank_device,
    spawn_workers,
)
from wok_runtime.core.step_graph import StepGraph
from wok_runtime.core.tokenizer import Tokenizer
from wok_runtime.kernels import brgemm_linear, paged_decode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInput:
    token_ids: list[int]  # the tokens to run this step (a prefill chunk, or 1 decode token)
    start_pos: int  # position of token_ids[0] in the sequence
    block_table: list[int]  # KV blocks of the sequence, covering positions [0, start_pos+len)


@dataclass
class _Prefill:
    """A multi-token input: its rows in the packed batch and the keys it attends to."""

    start: int  # first row of the chunk in the packed tokens
    end: int
    blocks: torch.Tensor | None  # (n_blocks,) blocks holding its keys; None: no prefix
    mask: torch.Tensor | None  # (n_tokens, n_blocks * bs) additive: 0 may attend, -inf not


@dataclass
class _DecodeGroup:
    """Single-token inputs of similar length, attended to in one padded SDPA call."""

    start: int  # first row of the group in the packed tokens
    end: int
    blocks: torch.Tensor  # ((end - start) * n_blocks,) each one's blocks, padded with block 0
    mask: torch.Tensor | None  # (end - start, 1, 1, n_blocks * bs) additive; None: no padding
    lengths: torch.Tensor | None  # (end - start,) keys each one attends to; kernel only


@dataclass
class _StepPlan:
    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    slots: torch.Tensor  # (T,) where each token's K/V is written
    last_rows: torch.Tensor  # (len(inputs),) row of each input's last token
    decodes: list[_DecodeGroup] = field(default_factory=list)  # rows [0, num_decode)
    prefills: list[_Prefill] = field(default_factory=list)  # the rows after them
    paged: PagedBatch | None = None  # the step as `kernel` takes it
    kernel: PagedKernel | None = None  # attends for every input (None: `decodes`, `prefills`)


class _PagedAttention:
    """The attention backend of one step: writes K/V into the pool, attends over the blocks.

    The pool is head-major, (KVH, blocks, bs, hd) per layer, so that gathering a sequence's
    blocks yields, per KV head, one contiguous (n_keys, hd) matrix: the layout SDPA's CPU kernel
    is fast on (a transposed view of a token-major pool made it several times slower)."""

    def __init__(self, runner: ModelRunner, plan: _StepPlan) -> None:
        self.k_slots, self.v_slots = runner._k_slots, runner._v_slots  # (layers, KVH, slots, hd)
        self.k_blocks, self.v_blocks = runner.k_blocks, runner.v_blocks  # (layers, KVH, blocks, …)
        self.plan = plan
        self.kernel = runner.decode_kernel
        self.paged_kernel = plan.kernel

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        plan = self.plan
        k_blocks, v_blocks = self.k_blocks[layer], self.v_blocks[layer]  # (KVH, blocks, bs, hd)
        if self.kernel is not None:
            self.kernel.write_kv(k, v, plan.slots, k_blocks, v_blocks)
        else:
            self.k_slots[layer].index_copy_(1, plan.slots, k.transpose(0, 1))  # k: (T, KVH, hd)
            self.v_slots[layer].index_copy_(1, plan.slots, v.transpose(0, 1))
        if self.paged_kernel is not None:  # planned for this step (ModelRunner._plan_kernel)
            return self.paged_kernel.attend(q, k_blocks, v_blocks)
        _, n_heads, head_dim = q.shape
        n_kv_heads = k.shape[1]
        parts: list[torch.Tensor] = []
        for group in plan.decodes:
            B = group.end - group.start
            if self.kernel is not None:
                out = self.kernel.attend(
                    q[group.start : group.end],  # (B, H, hd)
                    k_blocks,
                    v_blocks,
                    group.blocks.view(B, -1),  # (B, n_blocks)
                    group.lengths,
                    head_dim**-0.5,
                )
                parts.append(out)
                continue
            # Query heads grouped under the KV head they share: GQA without repeating K/V.
            qd = q[group.start : group.end].view(B, n_kv_heads, -1, head_dim)  # (B, KVH, G, hd)
            # Whole blocks are gathered (one memcpy each), not single slots.
            kd = k_blocks.index_select(1, group.blocks)  # (KVH, B * n_blocks, bs, hd)
            vd = v_blocks.index_select(1, group.blocks)
            out = F.scaled_dot_product_attention(
                qd,
                kd.view(n_kv_heads, B, -1, head_dim).transpose(0, 1),  # (B, KVH, n_keys, hd)
                vd.view(n_kv_heads, B, -1, head_dim).transpose(0, 1),
                attn_mask=group.mask,
            )  # (B, KVH, G, hd)
            parts.append(out.reshape(B, n_heads, head_dim))  # (B, H, hd)
        for chunk in plan.prefills:
            qp = q[chunk.start : chunk.end].transpose(0, 1)[None]  # (1, H, Tq, hd)
            if chunk.blocks is None:
                kp = k[chunk.start : chunk.end].transpose(0, 1)[None]  # (1, KVH, Tq, hd)
                vp = v[chunk.start : chunk.end].transpose(0, 1)[None]
            else:
                kp = k_blocks.index_select(1, chunk.blocks).view(1, n_kv_heads, -1, head_dim)
                vp = v_blocks.index_select(1, chunk.blocks).view(1, n_kv_heads, -1, head_dim)
            out = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=chunk.mask, is_causal=chunk.mask is None, enable_gqa=True
            )  # (1, H, Tq, hd)
            parts.append(out[0].transpose(0, 1))  # (Tq, H, hd)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        *,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        source: str = "",
        kv_memory: KvMemory | None = None,
        workers: list[Any] | None = None,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the KV cache must hold at least one block, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.model = model
        self.config: ModelConfig = model.config
        self.tokenizer = tokenizer
        self.source = source
        self.model_name = source or "wok"
        self.kv_memory = kv_memory  # the pool's size against the measured room (metrics)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.parallel: Parallel = model.parallel
        self.workers = workers or []  # rank 0's spawned ranks (processes)
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        # The whole model's (all ranks'), as the budget counts it.
        self.kv_bytes_per_token = self.config.kv_bytes_per_token(self.dtype.itemsize)
        c = self.config
        kv_heads, layers = c.num_key_value_heads // self.parallel.size, c.num_hidden_layers
        # One block more than the budget's: the scratch block, which no sequence owns, where the
        # padded rows of a captured decode step write (decode_graphs.py).
        self.scratch_block = num_blocks
        shape = (layers, kv_heads, num_blocks + 1, block_size, c.head_dim)
        # Zeros, not empty: padded gathers read unwritten slots, and garbage there could be NaN,
        # which a zero attention weight does not cancel (0 * NaN = NaN).
        self.k_blocks = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_blocks = torch.zeros(shape, dtype=self.dtype, device=self.device)
        flat = (layers, kv_heads, (num_blocks + 1) * block_size, c.head_dim)
        self._k_slots = self.k_blocks.view(flat)  # (layers, KVH, num_slots, hd)
        self._v_slots = self.v_blocks.view(flat)
        self._pin = self.device.type == "cuda"
        # Decode attention over the blocks in place and the step's K/V writes (paged_decode.py),
        # built by `compile` on a CPU; None: index_copy_, gathers and SDPA.
        self.decode_kernel: paged_decode.Kernel | None = None
        # The whole step as one compiled graph (step_graph.py), made by `compile`; None: eager.
        self.step_graph: StepGraph | None = None
        # Decode steps replayed from CUDA graphs (decode_graphs.py), made by
        # `capture_decode_graphs`; None: every step runs as launched.
        self.decode_graphs: DecodeGraphs | None = None
        # Attention over the pages in place for every input (paged_attention.py): FlashInfer on
        # CUDA where it imports (`use_attention_kernel`); None: the backend above.
        self.paged_kernel: PagedKernel | None = None

    def capture_decode_graphs(
        self, max_batch: int = MAX_CAPTURED_BATCH, capture: GraphCapture | None = None
    ) -> tuple[int, ...]:
        """Captures the decode step for the batch sizes up to `max_batch` (`capture`: CUDA
        graphs; on a device without them, nothing is captured unless a capture is given).
        Returns the sizes captured; a size that fails to capture runs eager (logged)."""
        self.decode_graphs = None
        if self.workers or self.parallel.size > 1:
            log.info("decode graphs are not captured under tensor parallelism; steps run eager")
            return ()
        if capture is None:
            if self.device.type != "cuda":
                return ()
            capture = CudaGraphCapture()
        with torch.inference_mode():
            graphs = DecodeGraphs(self, capture_sizes(max_batch), capture)
        self.k_blocks.zero_()  # the captures' K/V (see __init__: no garbage in the pool)
        self.v_blocks.zero_()
        if graphs.captured:
            self.decode_graphs = graphs
        log.info("decode steps captured for batch sizes %s", list(graphs.captured))
        return graphs.captured

    def static_decode_plan(
        self,
        *,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        last_rows: torch.Tensor,
        block_tables: torch.Tensor,
        lengths: torch.Tensor,
        mask: torch.Tensor,
    ) -> _StepPlan:
        """A decode step over fixed tensors (a captured graph's): every row one sequence, its
        block table padded to `block_tables`' width; `mask` hides the keys past each length."""
        B = input_ids.shape[0]
        with_kernel = self.decode_kernel is not None
        group = _DecodeGroup(
            0,
            B,
            block_tables.reshape(-1),
            None if with_kernel else mask,
            lengths if with_kernel else None,
        )
        return _StepPlan(input_ids, positions, slots, last_rows, decodes=[group])

    def use_attention_kernel(self, choice: str = "auto") -> bool:
        """Chooses the paged attention kernel (paged_attention.kernel_for); returns whether one
        is in use."""
        self.paged_kernel = paged_attention.kernel_for(
            self.device, block_size=self.block_size, head_dim=self.config.head_dim, choice=choice
        )
        return self.paged_kernel is not None

    @classmethod
    def from_source(
        cls,
        source: str,
        *,
        dtype: str = "float32",
        device: str | None = None,
        block_size: int = 16,
        kv_cache_bytes: int | None = None,
        gpu_memory_utilization: float = 0.9,
        max_num_batched_tokens: int = 2048,
        max_model_len: int | None = None,
        compile: bool = False,
        tensor_parallel_size: int = 1,
        parallel: Parallel | None = None,
        port: int | None = None,
        attention: str = "auto",
        cuda_graph_max_batch: int = 0,
    ) -> ModelRunner:
        """`tensor_parallel_size` > 1 spawns the other ranks (which call this with their
        `parallel` and the group's `port`). `attention` chooses the paged attention kernel
        (paged_attention.kernel_for: "auto" is FlashInfer on CUDA where it imports);
        `cuda_graph_max_batch` > 0 captures decode graphs up to that batch (on CUDA)."""
        parallel = parallel or Parallel(0, tensor_parallel_size)
        torch_device, torch_dtype = _checked_settings(
            device, dtype, parallel, gpu_memory_utilization, max_num_batched_tokens
        )
        path = resolve_source(source)
        workers: list[Any] = []
        if parallel.size > 1:
            same = {  # every rank sizes the same pool for the same model
                "source": source,
                "dtype": dtype,
                "device": device,
                "block_size": block_size,
                "kv_cache_bytes": kv_cache_bytes,
                "gpu_memory_utilization": gpu_memory_utilization,
                "max_num_batched_tokens": max_num_batched_tokens,
                "max_model_len": max_model_len,
                "attention": attention,
            }
            torch_device, workers = _join_tensor_parallel(
                parallel, port, torch_device, path, compile, same
            )
        model = load_model(path, dtype=torch_dtype, device=torch_device, parallel=parallel)
        tokenizer = Tokenizer.from_dir(path)
        config = model.config
        max_model_len = _checked_max_model_len(max_model_len, config)
        if torch_device.type == "cpu" and torch_dtype == torch.bfloat16:
            prepare_cpu_gemms(model)
        kv_memory = _size_kv_pool(
            model,
            torch_device,
            parallel,
            kv_cache_bytes,
            gpu_memory_utilization,
            max_num_batched_tokens,
        )
        block_bytes = config.kv_bytes_per_token(torch_dtype.itemsize) * block_size
        runner = cls(
            model,
            tokenizer,
            num_blocks=_num_blocks(
                kv_memory.budget_bytes, block_bytes, block_size, parallel, torch_device
            ),
            block_size=block_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            source=source,
            kv_memory=kv_memory,
            workers=workers,
        )
        runner.prepare_steps(attention, compile=compile, cuda_graph_max_batch=cuda_graph_max_batch)
        return runner

    def prepare_steps(self, attention: str, *, compile: bool, cuda_graph_max_batch: int) -> None:
        """Readies the steps before the first request: the attention kernel, then, if asked, the
        compiled step and the captured decode graphs."""
        self.use_attention_kernel(attention)
        if compile:
            self.compile()
        if cuda_graph_max_batch > 0:
            self.capture_decode_graphs(cuda_graph_max_batch)

    def compile(self) -> bool:
        """Compiles the whole step into one graph (step_graph.py) and runs one step, so that no
        request waits for the compiler; on a CPU also builds the decode attention kernel
        (paged_decode.py) and, for bfloat16 on a CPU with AMX, moves the linears onto brgemm
        (brgemm_linear.py). Any failure leaves the model eager, attention on SDPA or the
        linears on oneDNN (logged). Returns whether the model runs compiled."""
        started = time.perf_counter()
        if self.device.type == "cpu" and self.config.head_dim in paged_decode.HEAD_DIMS:
            self.decode_kernel = paged_decode.load()
        if self.device.type == "cpu" and self.dtype == torch.bfloat16 and brgemm_linear.load():
            count = self.model.pack_gemm_weights_for_brgemm()
            log.info("%d of %d linears on brgemm", count, len(self.model.linears()))
        self.step_graph = StepGraph(self.model)
        try:
            self.forward([StepInput([0], 0, [0])])  # one graph serves every step's shape
        except Exception:
            log.warning("compiling the model failed; it runs eager", exc_info=True)
            self.step_graph = None
            return False
        finally:
            self.k_blocks.zero_()  # the warm-up's K/V (see __init__: no garbage in the pool)
            self.v_blocks.zero_()
        log.info("model compiled and warmed up in %.1f s", time.perf_counter() - started)
        return True

    @torch.inference_mode()
    def forward(self, inputs: list[StepInput]) -> torch.Tensor:
        """Writes each input's K/V into its blocks, returns fp32 logits of the LAST token of each
        input: shape (len(inputs), vocab)."""
        if not inputs:
            return torch.empty(0, self.config.vocab_size, device=self.device)
        if self.decode_graphs is not None:
            logits = self.decode_graphs.run(inputs)
            if logits is not None:
                return logits
        plan = self._plan(inputs)  # checked before any other rank sees the step
        if self.workers:
            # A rank that died would leave the broadcast waiting for it: fail the step instead.
            dead = [w.exitcode for w in self.workers if not w.is_alive()]
            if dead:
                raise RuntimeError(f"a tensor-parallel rank exited (exit code {dead[0]})")
            broadcast_step(inputs)
        self._plan_kernel(plan)
        return self.run_plan(plan)

    def run_plan(self, plan: _StepPlan) -> torch.Tensor:
        """The step of a plan whose kernel (if any) is planned: fp32 logits of its last rows.
        Reads only the plan's tensors and the pool, so a CUDA graph can capture it."""
        if self.step_graph is not None:
            attention = _PagedAttention(self, plan)
            return self.step_graph(plan.input_ids, plan.positions, plan.last_rows, attention)
        return self.model.logits(self._hidden(plan))  # (len(inputs), vocab)

    @torch.inference_mode()
    def forward_shard(self, inputs: list[StepInput]) -> None:
        """A worker rank's part of a step that rank 0 sent (its logits are rank 0's)."""
        self._run(self._plan(inputs))

    def _run(self, plan: _StepPlan) -> torch.Tensor:
        """The step through the model: hidden states of each input's last token (every rank
        ends with all of them)."""
        self._plan_kernel(plan)
        return self._hidden(plan)

    def _hidden(self, plan: _StepPlan) -> torch.Tensor:
        backend = _PagedAttention(self, plan)
        hidden = self.model(plan.input_ids, plan.positions, backend)  # (T, hidden)
        return hidden[plan.last_rows]

    def _plan_kernel(self, plan: _StepPlan) -> None:
        """Plans the step's paged kernel, once for all layers."""
        if plan.kernel is not None and plan.paged is not None:
            self.plan_kernel(plan.kernel, plan.paged)

    def plan_kernel(self, kernel: PagedKernel, batch: PagedBatch) -> None:
        c = self.config
        kernel.plan(
            batch,
            num_heads=c.num_attention_heads // self.parallel.size,
            num_kv_heads=c.num_key_value_heads // self.parallel.size,
            head_dim=c.head_dim,
            dtype=self.dtype,
        )

    def close(self) -> None:
        """Stops the other ranks (they also end with this process: they are daemons)."""
        if not self.workers:
            return
        broadcast_step(None)
        for worker in self.workers:
            worker.join(timeout=30)
        self.workers = []
        torch.distributed.destroy_process_group()

    def check_input(self, x: StepInput) -> None:
        """A clear error for an input no step can run."""
        n, start, table = len(x.token_ids), x.start_pos, x.block_table
        end = start + n
        if n == 0:
            raise ValueError("a step input has no tokens")
        if start < 0 or end > self.max_model_len:
            raise ValueError(f"positions [{start}, {end}) exceed max_model_len")
        if len(table) * self.block_size < end:
            raise ValueError(f"block table of {len(table)} blocks does not cover {end} tokens")
        if table and (min(table) < 0 or max(table) >= self.num_blocks):
            raise ValueError(f"a block table names a block outside [0, {self.num_blocks})")

    def _plan(self, inputs: list[StepInput]) -> _StepPlan:
        """Packs the step (single-token inputs first, so decode rows are one slice) and computes
        every index the layers need, on the host, then moves it to the device in one go."""
        # Decode inputs sorted by length, so that groups of similar length are row slices.
        decode = sorted(
            (i for i, x in enumerate(inputs) if len(x.token_ids) == 1),
            key=lambda i: inputs[i].start_pos,
        )
        prefill = [i for i, x in enumerate(inputs) if len(x.token_ids) != 1]
        order = decode + prefill
        plan = self._packed(inputs, order)
        if self.paged_kernel is not None:  # it needs none of the groups below
            plan.kernel = self.paged_kernel
            plan.paged = paged_batch(
                [len(inputs[i].token_ids) for i in order],
                [inputs[i].start_pos + len(inputs[i].token_ids) for i in order],
                [inputs[i].block_table for i in order],
                self.block_size,
            )
            return plan
        plan.decodes.extend(self._decode_groups(inputs, decode))
        plan.prefills.extend(self._prefills(inputs, prefill, first_row=len(decode)))
        return plan

    def _packed(self, inputs: list[StepInput], order: list[int]) -> _StepPlan:
        """The plan's packed rows, in `order`: each token's id, position and KV slot, and each
        input's last row; every input checked, and the step's tokens against the budget."""
        bs = self.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_rows = [0] * len(inputs)
        for i in order:
            x = inputs[i]
            self.check_input(x)
            n, start, table = len(x.token_ids), x.start_pos, x.block_table
            end = start + n
            token_ids.extend(x.token_ids)
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            last_rows[i] = len(token_ids) - 1
        if len(token_ids) > self.max_num_batched_tokens:
            raise ValueError(
                f"{len(token_ids)} tokens exceed max_num_batched_tokens "
                f"({self.max_num_batched_tokens})"
            )
        to = self._to_device
        return _StepPlan(
            input_ids=to(torch.tensor(token_ids)),
            positions=to(torch.tensor(positions)),
            slots=to(torch.tensor(slots)),
            last_rows=to(torch.tensor(last_rows)),
        )

    def _decode_groups(self, inputs: list[StepInput], decode: list[int]) -> list[_DecodeGroup]:
        """The decode rows (`decode`, ascending by length) as groups attended to together: one
        for the decode kernel, which reads no padding, else groups of similar length for SDPA,
        each padded to its longest and masked."""
        bs, to = self.block_size, self._to_device
        lengths = [inputs[i].start_pos + 1 for i in decode]  # ascending
        if self.decode_kernel is not None:  # it reads no padding: one group
            groups = [(0, len(decode))] if decode else []
        else:  # SDPA attends over padded copies: groups of similar length
            groups = _length_groups([-(-n // bs) for n in lengths])
        decodes = []
        for start, end in groups:
            group = decode[start:end]
            n_blocks = -(-lengths[end - 1] // bs)
            # Padding points at block 0; the mask hides it (and the unwritten tail of each).
            padded = [(list(inputs[i].block_table) + [0] * n_blocks)[:n_blocks] for i in group]
            blocks = to(torch.tensor(padded).view(-1))  # (B * n_blocks,)
            mask = None
            if self.decode_kernel is None and lengths[start] != n_blocks * bs:
                keys = torch.arange(n_blocks * bs)[None, :]
                allowed = keys < torch.tensor(lengths[start:end])[:, None]  # (B, n_keys)
                mask = to(self._additive(allowed[:, None, None, :]))
            group_lengths = None
            if self.decode_kernel is not None:
                group_lengths = to(torch.tensor(lengths[start:end]))
            decodes.append(_DecodeGroup(start, end, blocks, mask, group_lengths))
        return decodes

    def _prefills(
        self, inputs: list[StepInput], prefill: list[int], *, first_row: int
    ) -> list[_Prefill]:
        """The multi-token inputs' rows from `first_row` on, each with the blocks and the causal
        mask of the prefix it attends to (none from position 0)."""
        bs, to = self.block_size, self._to_device
        prefills = []
        row = first_row
        for i in prefill:
            x = inputs[i]
            n, start = len(x.token_ids), x.start_pos
            if start == 0:
                prefills.append(_Prefill(row, row + n, None, None))
            else:
                n_blocks = -(-(start + n) // bs)
                blocks = torch.tensor(x.block_table[:n_blocks])
                # Query t sits at position start+t and sees keys at positions <= start+t.
                mask = (
                    torch.arange(n_blocks * bs)[None, :] <= torch.arange(start, start + n)[:, None]
                )
                prefills.append(_Prefill(row, row + n, to(blocks), to(self._additive(mask))))
            row += n
        return prefills

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """A bool mask (True: may attend) as the float one SDPA adds to the scores, made once a
        step: given the bool one, every layer's SDPA call converts it again, which cost up to
        half of a decode's attention (bench/runtime/results/cpu_kernels.md)."""
        return torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, float("-inf"))

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._pin:
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor


def prepare_cpu_gemms(model: Transformer) -> None:
    """A bfloat16 model on a CPU with AMX runs every linear on its weight prepacked for oneDNN,
    as vLLM's CPU backend does (1.01–1.18× the engine's tok/s,
    bench/runtime/results/cpu_gemm_packing.md). Without AMX its larger GEMMs run on fp32 copies of
    the weights (model.FP32_GEMM_MIN_ROWS): the memory for twice the speed of prefills and large
    decode batches."""
    if torch.cpu._is_amx_tile_supported():
        model.pack_gemm_weights()
        log.info("bfloat16 on a CPU with AMX: linear weights prepacked for oneDNN")
        return
    extra = model.keep_fp32_gemm_weights()
    log.info(
        "bfloat16 on a CPU without AMX: fp32 copies of the linear weights (%.0f MiB) for steps "
        "of %d rows or more",
        extra / 2**20,
        FP32_GEMM_MIN_ROWS,
    )


def require_cuda(device: torch.device, *, gpus: int = 1) -> None:
    """A CUDA device that was asked for must be there: a GPU pod never falls back to the CPU
    (it would serve, slowly, from a KV pool sized for the GPU)."""
    with warnings.catch_warnings():  # is_available() may warn about the driver: one line only
        warnings.simplefilter("ignore")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
        raise ValueError(
            f"device {str(device)!r} was asked for but CUDA is not available (torch "
            f"{torch.__version__}, built with {build}; no GPU or driver visible); refusing to "
            "fall back to the CPU"
        )
    if device.index is not None and device.index >= count:
        raise ValueError(
            f"device {str(device)!r} was asked for but only {count} GPU(s) are visible"
        )
    if gpus > count:
        raise ValueError(f"tensor parallelism over {gpus} GPUs, but {count} are visible")


# What one more SDPA call costs, in gathered blocks of padding it must save to be worth it.
_GROUP_COST_BLOCKS = 24


def _length_groups(n_blocks: list[int]) -> list[tuple[int, int]]:
    """Splits ascending per-sequence block counts into row ranges [start, end) that minimise
    blocks gathered (padding included) + a fixed cost per group. Exact dynamic programming over
    the distinct counts; past 64 distinct counts, four equal-size groups instead."""
    n = len(n_blocks)
    if n == 0:
        return []
    # Boundaries: the first row of each distinct count, plus n.
    starts = [i for i in range(n) if i == 0 or n_blocks[i] != n_blocks[i - 1]] + [n]
    u = len(starts) - 1
    if u > 64:
        edges = sorted({0, n // 4, n // 2, 3 * n // 4, n})
        return list(itertools.pairwise(edges))
    best = [0] + [1 << 62] * u  # best[j]: cost of rows [0, starts[j])
    cut = [0] * (u + 1)
    for j in range(1, u + 1):
        end, width = starts[j], n_blocks[starts[j] - 1]
        for i in range(j):
            cost = best[i] + (end - starts[i]) * width + _GROUP_COST_BLOCKS
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups = []
    j = u
    while j > 0:
        groups.append((starts[cut[j]], starts[j]))
        j = cut[j]
    return groups[::-1]


def _checked_settings(
    device: str | None,
    dtype: str,
    parallel: Parallel,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
) -> tuple[torch.device, torch.dtype]:
    """The runner's device (CUDA where there is one, unless named) and dtype, once the device
    has the GPUs the group needs and the memory fraction and token budget are in range."""
    torch_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if torch_device.type == "cuda":
        require_cuda(torch_device, gpus=parallel.size)
    torch_dtype = parse_dtype(dtype)
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    if max_num_batched_tokens <= 0:
        raise ValueError("max_num_batched_tokens must be positive")
    return torch_device, torch_dtype


def _join_tensor_parallel(
    parallel: Parallel,
    port: int | None,
    device: torch.device,
    path: Path,
    compile: bool,
    same: dict[str, Any],
) -> tuple[torch.device, list[Any]]:
    """Joins this rank to the tensor-parallel group: rank 0 first spawns the other ranks (with
    the runner's arguments `same`), a worker rank is given the group's `port`. Returns the
    rank's device and the workers rank 0 spawned."""
    # Errors a rank would hit are found here, before any rank starts.
    check_divisible(ModelConfig.from_file(path / "config.json"), parallel.size)
    if compile:
        raise ValueError("--compile is not supported with tensor parallelism")
    workers: list[Any] = []
    if parallel.rank == 0:
        port = free_port()
        workers = spawn_workers(parallel.size, port, run_worker, same)
    assert port is not None, "a worker rank is given the group's port"
    device = rank_device(device, parallel)
    join_group(parallel, port, device)
    return device, workers


def _checked_max_model_len(max_model_len: int | None, config: ModelConfig) -> int:
    """The longest sequence served: the model's own context unless asked for less."""
    if max_model_len is None:
        return config.max_position_embeddings
    if not 0 < max_model_len <= config.max_position_embeddings:
        raise ValueError(
            f"max_model_len must be in [1, {config.max_position_embeddings}] for this model, "
            f"got {max_model_len}"
        )
    return max_model_len


def _num_blocks(
    budget_bytes: int, block_bytes: int, block_size: int, parallel: Parallel, device: torch.device
) -> int:
    """Blocks the KV budget holds; with tensor parallelism, the fewest any rank holds (block ids
    name the same block on every rank). Joins the ranks' all-reduce when there are several."""
    num_blocks = budget_bytes // block_bytes
    if parallel.size > 1:
        count = torch.tensor([num_blocks], device=device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN)
        num_blocks = int(count.item())
    if num_blocks <= 0:
        raise ValueError(
            f"a KV budget of {budget_bytes} bytes holds no block of {block_size} tokens "
            f"({block_bytes} bytes per block)"
        )
    return num_blocks


def _size_kv_pool(
    model: Transformer,
    torch_device: torch.device,
    parallel: Parallel,
    kv_cache_bytes: int | None,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
) -> KvMemory:
    """The KV pool's budget (`kv_cache_bytes`, or else the room measured for it) beside the
    measured room; logs the choice, and warns on CUDA where the two differ."""
    # The room for the pool, measured after the load (the weights are not free memory).
    if torch_device.type == "cuda":
        # Every GPU of the pod holds 1/N of the pool: the pod's room is N times this one's.
        measured = parallel.size * _cuda_kv_room(
            model, torch_device, gpu_memory_utilization, max_num_batched_tokens
        )
        where = f"measured free on {torch_device} at --gpu-memory-utilization "
        where += f"{gpu_memory_utilization:g}"
    else:
        available = available_bytes()
        measured = default_cpu_kv_bytes(available)
        where = f"the default for {available / 2**20:.0f} MiB of available host memory"
    if kv_cache_bytes is None:
        if measured <= 0:
            raise ValueError(f"no memory left for the KV cache: {measured} bytes, {where}")
        kv_cache_bytes = measured
        log.info(
            "KV cache on %s: %d bytes (%.0f MiB), %s (pass --kv-cache-bytes to choose)",
            torch_device.type,
            kv_cache_bytes,
            kv_cache_bytes / 2**20,
            where,
        )
    kv_memory = KvMemory(torch_device.type, kv_cache_bytes, measured)
    if torch_device.type == "cuda" and kv_memory.differs():
        log.warning(
            "the KV budget (--kv-cache-bytes) is %d bytes but %d bytes were %s: they differ "
            "by more than %.0f %% (the pool keeps the budget; check the operator's memory "
            "budget against this node)",
            kv_cache_bytes,
            measured,
            where.removeprefix("measured "),
            100 * KV_BUDGET_TOLERANCE,
        )
    return kv_memory


def _cuda_kv_room(
    model: Transformer, device: torch.device, utilization: float, max_num_batched_tokens: int
) -> int:
    """Bytes a GPU has for the KV cache: total × utilization − what is in use (weights) − the
    activation peak of the largest step, measured by running it once. May be <= 0."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    tokens = min(max_num_batched_tokens, model.config.max_position_embeddings)
    with torch.inference_mode():
        ids = torch.zeros(tokens, dtype=torch.long, device=device)
        hidden = model(ids, torch.arange(tokens, device=device), CausalAttention())
        model.logits(hidden[-min(tokens, 256) :])
        del hidden
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    peak = torch.cuda.max_memory_allocated(device)
    current = torch.cuda.memory_allocated(device)
    return int(total * utilization - used - (peak - current))


def run_worker(parallel: Parallel, port: int, threads: int, runner_kwargs: dict[str, Any]) -> None:
    """A worker rank: loads its shard, then runs every step rank 0 broadcasts until None."""
    # The ranks run in lock-step: as many CPU threads as rank 0, not a pool of its own size.
    torch.set_num_threads(threads)
    runner = ModelRunner.from_source(**runner_kwargs, parallel=parallel, port=port)
    try:
        while (inputs := broadcast_step(None)) is not None:
            runner.forward_shard(inputs)
    finally:
        leave_group()
