"""Paged `ModelRunner.forward` against a bare dense forward of the same shapes, side by side.

Why: the runtime's continuous batching is only worth its bookkeeping if the paged KV path costs
about what a plain contiguous-cache forward costs. Both paths share the same model object and
weights; they differ only in the attention backend (paged pool + per-step plan vs. one dense
`(B, kv_heads, max_len, head_dim)` cache per layer, like a static-batch `generate`). Runs are
interleaved and each figure is a median, because the machine is shared and noisy.

    .venv/bin/python bench/runtime/runner_overhead.py --model builtin:smollm2-135m --batch 16 32
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wok_runtime.core.model_runner import ModelRunner, StepInput


class DenseDecode:
    """A contiguous KV cache for B sequences: what a static-batch decode step does."""

    def __init__(self, runner: ModelRunner, lengths: list[int]) -> None:
        c = runner.config
        B, cap = len(lengths), max(lengths)
        shape = (c.num_hidden_layers, B, c.num_key_value_heads, cap, c.head_dim)
        self.k = torch.randn(shape, dtype=runner.dtype) * 0.02
        self.v = torch.randn(shape, dtype=runner.dtype) * 0.02
        self.rows = torch.arange(B)
        self.pos = torch.tensor(lengths) - 1  # where this step's token goes
        mask = torch.arange(cap)[None, :] < torch.tensor(lengths)[:, None]
        self.mask = None if min(lengths) == cap else mask[:, None, None, :]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        B, H, hd = q.shape
        KVH = k.shape[1]
        self.k[layer][self.rows, :, self.pos] = k  # (B, KVH, hd) into (B, KVH, cap, hd)
        self.v[layer][self.rows, :, self.pos] = v
        qd = q.view(B, KVH, H // KVH, hd)
        out = F.scaled_dot_product_attention(qd, self.k[layer], self.v[layer], attn_mask=self.mask)
        return out.reshape(B, H, hd)


@torch.inference_mode()
def dense_step(runner: ModelRunner, backend: DenseDecode, ids: torch.Tensor) -> torch.Tensor:
    hidden = runner.model(ids, backend.pos, backend)
    return runner.model.logits(hidden)


class PackedCausal:
    """Prefill without any cache: per-sequence causal attention over the packed rows."""

    def __init__(self, lengths: list[int]) -> None:
        self.bounds = []
        start = 0
        for n in lengths:
            self.bounds.append((start, start + n))
            start += n

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        out = [
            F.scaled_dot_product_attention(
                q[a:b].transpose(0, 1)[None],
                k[a:b].transpose(0, 1)[None],
                v[a:b].transpose(0, 1)[None],
                is_causal=True,
                enable_gqa=True,
            )[0].transpose(0, 1)
            for a, b in self.bounds
        ]
        return torch.cat(out)


@torch.inference_mode()
def bare_prefill(runner: ModelRunner, backend: PackedCausal, ids, positions, last) -> torch.Tensor:
    hidden = runner.model(ids, positions, backend)
    return runner.model.logits(hidden[last])


def make_decode_inputs(runner: ModelRunner, lengths: list[int], rng: random.Random):
    """Decode inputs whose blocks are scattered over the pool, as after hours of serving."""
    bs = runner.block_size
    blocks = list(range(runner.num_blocks))
    rng.shuffle(blocks)
    inputs = []
    for n in lengths:
        need = -(-n // bs)
        table, blocks = blocks[:need], blocks[need:]
        inputs.append(StepInput([rng.randrange(runner.config.vocab_size)], n - 1, table))
    return inputs


@torch.inference_mode()
def hf_vs_paged_decode(runner: ModelRunner, source: str, B: int, ctx: int, iters: int, rng):
    """Equal-length decode steps: HF LlamaForCausalLM (sdpa, its dynamic cache) vs ModelRunner."""
    from hf_reference import load_hf_model

    hf = load_hf_model(source)
    prompts = [[rng.randrange(1, runner.config.vocab_size) for _ in range(ctx)] for _ in range(B)]
    out = hf(input_ids=torch.tensor(prompts), use_cache=True)
    cache = out.cache
    next_ids = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
    inputs = make_decode_inputs(runner, [ctx + iters + 2] * B, rng)  # tables for the whole run
    tables = [x.block_table for x in inputs]
    for p, t in zip(prompts, tables, strict=True):  # one prompt per step: the token budget
        runner.forward([StepInput(p, 0, t)])
    pos = ctx
    hf_s, paged_s = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = hf(input_ids=next_ids, cache=cache, use_cache=True)
        hf_s.append(time.perf_counter() - t0)
        cache, next_ids = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        step = [StepInput([int(i)], pos, t) for i, t in zip(next_ids[:, 0], tables, strict=True)]
        paged_s.append(timed(runner.forward, step))
        pos += 1
    return {
        "step": "decode-vs-hf",
        "batch": B,
        "context": ctx,
        "hf_ms": 1e3 * statistics.median(hf_s),
        "paged_ms": 1e3 * statistics.median(paged_s),
        "hf_min_ms": 1e3 * min(hf_s),
        "paged_min_ms": 1e3 * min(paged_s),
    }


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def timing_summary(paged_s: list[float], dense_s: list[float], plan_s: list[float]) -> dict:
    """Medians in ms, the overhead and the ratios of the paged path over the bare one."""
    row = {
        "paged_ms": 1e3 * statistics.median(paged_s),
        "dense_ms": 1e3 * statistics.median(dense_s),
        "plan_ms": 1e3 * statistics.median(plan_s),
        # Minimums too: on a shared machine noise only adds, so min/min is the cleaner ratio.
        "paged_min_ms": 1e3 * min(paged_s),
        "dense_min_ms": 1e3 * min(dense_s),
    }
    row["overhead_ms"] = row["paged_ms"] - row["dense_ms"]
    row["ratio"] = row["paged_ms"] / row["dense_ms"]
    row["ratio_min"] = row["paged_min_ms"] / row["dense_min_ms"]
    return row


def decode_row(
    runner: ModelRunner, B: int, args: argparse.Namespace, rng: random.Random
) -> dict[str, Any]:
    """One decode step of B sequences of random context, paged against dense, interleaved."""
    lengths = [rng.randint(args.min_len, args.max_len) for _ in range(B)]
    inputs = make_decode_inputs(runner, lengths, rng)
    dense = DenseDecode(runner, lengths)
    ids = torch.tensor([x.token_ids[0] for x in inputs])
    for _ in range(2):  # warm-up both paths
        runner.forward(inputs)
        dense_step(runner, dense, ids)
    paged_s, dense_s, plan_s = [], [], []
    for _ in range(args.iters):
        paged_s.append(timed(runner.forward, inputs))
        dense_s.append(timed(dense_step, runner, dense, ids))
        plan_s.append(timed(runner._plan, inputs))
    row = {
        "step": "decode",
        "batch": B,
        "mean_context": statistics.mean(lengths),
        **timing_summary(paged_s, dense_s, plan_s),
    }
    print(
        f"decode  B={B:3d} ctx~{row['mean_context']:.0f}  paged {row['paged_ms']:7.2f} ms  "
        f"dense {row['dense_ms']:7.2f} ms  overhead {row['overhead_ms']:+6.2f} ms "
        f"({row['ratio']:.3f}x; min/min {row['ratio_min']:.3f}x)  plan {row['plan_ms']:.3f} ms",
        flush=True,
    )
    return row


def prefill_row(runner: ModelRunner, B: int, rng: random.Random, *, iters: int) -> dict[str, Any]:
    """B prompts of 16-64 tokens in one step (the cache writes and the plan are the cost), paged
    against a bare packed forward, interleaved."""
    lengths = [rng.randint(16, 64) for _ in range(B)]
    inputs = make_decode_inputs(runner, lengths, rng)
    inputs = [
        StepInput([rng.randrange(runner.config.vocab_size) for _ in range(n)], 0, x.block_table)
        for n, x in zip(lengths, inputs, strict=True)
    ]
    backend = PackedCausal(lengths)
    ids = torch.tensor([t for x in inputs for t in x.token_ids])
    positions = torch.cat([torch.arange(n) for n in lengths])
    last = torch.tensor([b - 1 for _, b in backend.bounds])
    for _ in range(2):
        runner.forward(inputs)
        bare_prefill(runner, backend, ids, positions, last)
    paged_s, dense_s, plan_s = [], [], []
    for _ in range(iters):
        paged_s.append(timed(runner.forward, inputs))
        dense_s.append(timed(bare_prefill, runner, backend, ids, positions, last))
        plan_s.append(timed(runner._plan, inputs))
    row = {
        "step": "prefill",
        "batch": B,
        "tokens": sum(lengths),
        **timing_summary(paged_s, dense_s, plan_s),
    }
    print(
        f"prefill B={B:3d} {row['tokens']} tokens  paged {row['paged_ms']:7.2f} ms  "
        f"bare {row['dense_ms']:7.2f} ms  overhead {row['overhead_ms']:+6.2f} ms "
        f"({row['ratio']:.3f}x; min/min {row['ratio_min']:.3f}x)  plan {row['plan_ms']:.3f} ms",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--min-len", type=int, default=32, help="shortest context in the batch")
    parser.add_argument("--max-len", type=int, default=192, help="longest context in the batch")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hf",
        action="store_true",
        help="also time HF LlamaForCausalLM decode steps (DynamicCache)",
    )
    parser.add_argument("--only-hf", action="store_true", help="only the --hf comparison")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    runner = ModelRunner.from_source(args.model, kv_cache_bytes=1 << 30)
    rng = random.Random(args.seed)
    batches = [] if args.only_hf else args.batch
    rows = [decode_row(runner, B, args, rng) for B in batches]
    rows += [prefill_row(runner, B, rng, iters=max(3, args.iters // 3)) for B in batches]
    if args.hf or args.only_hf:
        for B in args.batch:
            row = hf_vs_paged_decode(runner, args.model, B, 96, args.iters, rng)
            rows.append(row)
            print(
                f"decode vs HF B={B:3d} ctx 96+  HF {row['hf_ms']:7.2f} ms  "
                f"wok paged {row['paged_ms']:7.2f} ms  "
                f"(HF/wok {row['hf_ms'] / row['paged_ms']:.2f}x; "
                f"min/min {row['hf_min_ms'] / row['paged_min_ms']:.2f}x)",
                flush=True,
            )
    print(json.dumps({"model": args.model, "threads": torch.get_num_threads(), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
