"""Hugging Face `transformers` baselines for the engine benchmark: what wok is measured against.

Two baselines on the same model files wok loads (a built-in model is a standard HF directory):

- `hf_static_generate`: `model.generate` on static batches of N requests in arrival order, left
  padded, greedy. Each batch runs until its longest request is done; only the tokens a request
  asked for count as output (what a server built on `generate` would return).
- `hf_continuous_generate`: transformers' own continuous batching
  (`ContinuousBatchingManager`, transformers ≥ 5), one request per prompt with its own
  `max_new_tokens`, at most N requests per batch.

EOS is disabled in both (the workload fixes each request's output length, as wok's benchmark does
with `ignore_eos`). Both return an `HFRun`: useful output tokens, wall time, per-request
end-to-end latency, and the greedy outputs (to check wok's tokens against).

    .venv/bin/python bench/runtime/hf_reference.py --model builtin:tiny --requests 16 --batch 8
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class HFRun:
    name: str
    duration_s: float
    useful_tokens: int  # tokens the requests asked for (all produced)
    computed_slots: int  # decode slots computed, padding and overrun included (0: unknown)
    e2e_s: list[float]  # per request: arrival (all at t=0) to its last token
    outputs: list[list[int]]  # generated ids per request, in request order

    @property
    def output_tokens_per_s(self) -> float:
        return self.useful_tokens / self.duration_s


def load_hf_model(
    source: str,
    *,
    attn_implementation: str = "sdpa",
    dtype: str = "float32",
    device: str | None = None,
):
    """LlamaForCausalLM from a wok model source (builtin:NAME or a directory), on `device`
    (default: where transformers puts it, the CPU)."""
    from transformers import LlamaForCausalLM

    from wok_runtime.core.loader import resolve_source

    path = resolve_source(source)
    model = LlamaForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype), attn_implementation=attn_implementation
    )
    if device is not None:
        model = model.to(device)
    return model.eval()


def _greedy_config(max_new_tokens: int, pad_token_id: int):
    from transformers import GenerationConfig

    # eos_token_id=None: outputs run to max_new_tokens (and no eos warning spam).
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


@torch.inference_mode()
def hf_static_generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: list[int],
    *,
    batch_size: int,
    pad_token_id: int = 0,
) -> HFRun:
    """`generate` on static batches of `batch_size` requests in order, left padding, greedy."""
    if len(prompts) != len(max_new_tokens):
        raise ValueError("one max_new_tokens per prompt")
    outputs: list[list[int]] = []
    e2e: list[float] = []
    slots = 0
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch = list(
            zip(prompts[i : i + batch_size], max_new_tokens[i : i + batch_size], strict=True)
        )
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        longest = max(n for _, n in batch)
        out = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=mask.to(model.device),
            generation_config=_greedy_config(longest, pad_token_id),
        )
        if out.is_cuda:
            torch.cuda.synchronize(out.device)  # the clock stops when the GPU is done
        done = time.perf_counter() - start  # every request of a static batch ends together
        slots += len(batch) * longest
        for row, (_, n) in enumerate(batch):
            outputs.append(out[row, width : width + n].tolist())
            e2e.append(done)
    return HFRun(
        name=f"hf-generate-static-{batch_size}",
        duration_s=time.perf_counter() - start,
        useful_tokens=sum(len(o) for o in outputs),
        computed_slots=slots,
        e2e_s=e2e,
        outputs=outputs,
    )


@torch.inference_mode()
def hf_continuous_generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: list[int],
    *,
    max_batch: int,
    block_size: int = 16,
    num_blocks: int = 1024,
    max_batch_tokens: int = 512,
    pad_token_id: int = 0,
    timeout_s: float = 3600.0,
) -> HFRun:
    """transformers' `ContinuousBatchingManager` (paged attention, per-request lengths, at most
    `max_batch` requests per step)."""
    from transformers.generation import ContinuousBatchingConfig

    if len(prompts) != len(max_new_tokens):
        raise ValueError("one max_new_tokens per prompt")
    # The manager logs a psutil hint at ERROR level on CPU; it is not an error for this use.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    config = ContinuousBatchingConfig(
        page_size=block_size,
        num_blocks=num_blocks,
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_batch,
        allow_block_sharing=False,  # no prefix caching: wok has none either
    )
    gen = _greedy_config(max(max_new_tokens), pad_token_id)
    results: dict[str, list[int]] = {}
    finished_at: dict[str, float] = {}
    start = time.perf_counter()
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=config, block=True, timeout=timeout_s
    ) as manager:
        ids = [
            manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=n)
            for i, (prompt, n) in enumerate(zip(prompts, max_new_tokens, strict=True))
        ]
        deadline = time.monotonic() + timeout_s
        while len(results) < len(prompts):
            if time.monotonic() > deadline:
                raise TimeoutError("transformers continuous batching did not finish")
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("the transformers continuous batching thread died")
                continue
            if result.is_finished():
                if result.error is not None:
                    raise RuntimeError(f"request {result.request_id} failed: {result.error}")
                results[result.request_id] = list(result.generated_tokens)
                finished_at[result.request_id] = time.perf_counter() - start
    outputs = [results[i] for i in ids]
    return HFRun(
        name=f"hf-continuous-{max_batch}",
        duration_s=time.perf_counter() - start,
        useful_tokens=sum(len(o) for o in outputs),
        computed_slots=0,
        e2e_s=[finished_at[i] for i in ids],
        outputs=outputs,
    )


def make_workload(
    n: int, *, vocab: int, prompt: tuple[int, int], output: tuple[int, int], seed: int
) -> tuple[list[list[int]], list[int]]:
    """`n` requests with uniform random prompt and output lengths (the reference workload)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(*prompt))] for _ in range(n)]
    return prompts, [rng.randint(*output) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 64))
    parser.add_argument("--output-len", type=int, nargs=2, default=(8, 128))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skip-continuous", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_hf_model(args.model)
    prompts, wants = make_workload(
        args.requests,
        vocab=model.config.vocab_size,
        prompt=tuple(args.prompt_len),
        output=tuple(args.output_len),
        seed=args.seed,
    )
    runs = [hf_static_generate(model, prompts, wants, batch_size=args.batch)]
    if not args.skip_continuous:
        runs.append(hf_continuous_generate(model, prompts, wants, max_batch=args.batch))
    for run in runs:
        print(
            f"{run.name:28s} {run.useful_tokens:6d} tokens {run.duration_s:8.2f} s "
            f"{run.output_tokens_per_s:8.1f} tok/s"
        )
    if len(runs) == 2:
        same = sum(a == b for a, b in zip(runs[0].outputs, runs[1].outputs, strict=True))
        print(f"identical greedy outputs: {same}/{len(prompts)}")
    summary = [{k: v for k, v in asdict(r).items() if k != "outputs"} for r in runs]
    print(json.dumps({"model": args.model, "threads": torch.get_num_threads(), "runs": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
