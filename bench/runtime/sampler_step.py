"""The sampler's cost per step on this CPU: greedy, temperature 1, and the operations behind it.

Why: a client that sets no temperature (OpenAI's default, 1; `vllm bench serve` among them) sends
every row through the sampling path, and a decode step of a small model takes a few ms here
(bench/vllm/results/client_agreement*.md). This times `Sampler.sample` on 8 rows of logits at
the built-in models' vocabularies (8,192 for `tiny`, 49,152 for SmolLM2), one intra-op thread
as the served runtime runs, beside the torch operations the sampling path used to be (a sort
of the vocabulary, `torch.multinomial` row by row) and is (a cumsum and `searchsorted`). Medians
over `--iters`, the cases interleaved.

    .venv/bin/python bench/runtime/sampler_step.py     # writes results/sampler_step.md
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from wok_runtime.core.sampler import Sampler
from wok_runtime.core.sampling_params import SamplingParams

OUT = Path(__file__).resolve().parent / "results" / "sampler_step.md"
ROWS = 8


def cases(vocab: int) -> dict[str, Callable[[], object]]:
    logits = torch.randn(ROWS, vocab, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(logits, dim=-1)
    gen = torch.Generator().manual_seed(1)
    sampler = Sampler(seed=0)

    def rows(params: SamplingParams) -> list[tuple[str, SamplingParams]]:
        return [(f"r{i}", params) for i in range(ROWS)]

    def inverse_cdf() -> list[int]:
        cdf = probs.cumsum(dim=-1)
        targets = torch.rand(ROWS, 1, generator=gen) * cdf[:, -1:]
        return torch.searchsorted(cdf, targets, right=True).view(-1).tolist()

    return {
        "Sampler.sample, greedy": lambda: sampler.sample(logits, rows(SamplingParams())),
        "Sampler.sample, temperature 1": lambda: sampler.sample(
            logits, rows(SamplingParams(temperature=1.0))
        ),
        "Sampler.sample, temperature 1, top_p 0.9": lambda: sampler.sample(
            logits, rows(SamplingParams(temperature=1.0, top_p=0.9))
        ),
        "sort of the vocabulary": lambda: logits.sort(dim=-1, descending=True),
        "torch.multinomial, row by row": lambda: [
            int(torch.multinomial(probs[r], 1, generator=gen).item()) for r in range(ROWS)
        ],
        "cumsum + searchsorted (inverse CDF)": inverse_cdf,
    }


def time_cases(vocab: int, iters: int) -> dict[str, float]:
    """Median ms per call of each case, the cases interleaved so that the machine's drift hits
    all of them."""
    chosen = cases(vocab)
    for run in chosen.values():  # warm-up
        run()
    samples: dict[str, list[float]] = {name: [] for name in chosen}
    for _ in range(iters):
        for name, run in chosen.items():
            start = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {vocab: time_cases(vocab, args.iters) for vocab in (8192, 49152)}
    lines = [
        "# The sampler's cost per step, 8 rows, one thread",
        "",
        f"Produced by `{shlex.join(['python', 'bench/runtime/sampler_step.py', *sys.argv[1:]])}`"
        f" on {datetime.now(UTC):%Y-%m-%dT%H:%M}Z ({os.cpu_count()} CPUs shared with other "
        f"work, load average {os.getloadavg()[0]:.1f}); torch {torch.__version__}; median ms "
        f"per call over {args.iters} interleaved calls.",
        "",
        "| case | vocabulary 8,192 (`tiny`) | vocabulary 49,152 (SmolLM2) |",
        "|---|---|---|",
    ]
    for name in results[8192]:
        lines.append(f"| {name} | {results[8192][name]:.3f} | {results[49152][name]:.3f} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
