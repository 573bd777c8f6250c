"""Turns each sequence's last-token logits into its next token.

Batched where the requests allow: all greedy rows in one argmax, all sampled rows through one
temperature / top-k / top-p pass. A request with a `seed` draws from its own `torch.Generator`
(kept across steps and preemptions until `release`), so its output does not depend on what else
shares the batch. A row with non-finite logits yields None: the engine fails that request alone.
"""

from __future__ import annotations

import torch

from wok_runtime.core.sampling_params import SamplingParams


class Sampler:
    def __init__(self, seed: int | None = None) -> None:
        self._generators: dict[str, torch.Generator] = {}
        # Unseeded requests share one generator, so a whole run is reproducible from `seed`.
        self._shared: torch.Generator | None = None
        self._shared_seed = seed

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(
        self, request_id: str, params: SamplingParams, device: torch.device
    ) -> torch.Generator:
        if params.seed is None:
            if self._shared is None or self._shared.device != device:
                self._shared = torch.Generator(device=device)
                if self._shared_seed is None:
                    self._shared.seed()
                else:
                    self._shared.manual_seed(self._shared_seed)
            return self._shared
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(params.seed)
            self._generators[request_id] = gen
        return gen

    @torch.inference_mode()
    def sample(
        self, logits: torch.Tensor, requests: list[tuple[str, SamplingParams]]
    ) -> list[int | None]:
        """logits: (B, vocab) fp32, one row per (request_id, params). None for a poisoned row."""
        assert logits.dim() == 2 and logits.shape[0] == len(requests)
        result: list[int | None] = [None] * len(requests)
        # One reduction instead of a (B, vocab) mask: a row sums to a finite number only if all of
        # it is finite (logits are far from fp32's overflow range).
        finite = torch.isfinite(logits.sum(dim=1)).tolist()
        greedy = [i for i, (_, p) in enumerate(requests) if finite[i] and p.greedy]
        sampled = [i for i, (_, p) in enumerate(requests) if finite[i] and not p.greedy]
        if greedy:
            rows = logits if len(greedy) == len(requests) else logits[greedy]  # no copy if all
            tokens = rows.argmax(dim=-1).tolist()  # (G,)
            for i, t in zip(greedy, tokens, strict=True):
                result[i] = t
        if sampled:
            probs = self._filtered_probs(logits[sampled], [requests[i][1] for i in sampled])
            device = logits.device
            draws = torch.cat(
                [
                    torch.rand(1, generator=self._generator(*requests[i], device), device=device)
                    for i in sampled
                ]
            )
            for i, token in zip(sampled, self._inverse_cdf(probs, draws), strict=True):
                result[i] = token
        return result

    @staticmethod
    def _inverse_cdf(probs: torch.Tensor, draws: torch.Tensor) -> list[int]:
        """A token per row: the first whose cumulative probability passes the row's uniform draw
        (S,). One cumsum for the batch: `torch.multinomial` row by row took 1.8 ms a step of 8
        rows at an 8k vocabulary on the CPU and 14 ms at 49k; this takes 0.07 and 0.34 ms."""
        cdf = probs.cumsum(dim=-1)  # (S, vocab)
        # Scaled by the row's own total, so that rounding in the sum never points past the last
        # token with mass; `right` skips tokens without mass (their cdf does not rise).
        targets = draws.unsqueeze(1) * cdf[:, -1:]
        return torch.searchsorted(cdf, targets, right=True).view(-1).tolist()

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Probabilities after temperature, top-k and top-p, for every row at once. (S, vocab)"""
        temps = torch.tensor([p.temperature for p in params], device=logits.device)  # (S,)
        logits = logits / temps.unsqueeze(1)
        vocab = logits.shape[-1]
        # Only the rows that cut go through the sort: sorting the vocabulary costs more than a
        # small model's whole step on the CPU (bench/vllm/results/client_agreement.md), and a
        # client that sets no top-k / top-p (OpenAI's defaults) needs none.
        cut = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0]
        probs = torch.softmax(logits, dim=-1)
        if cut:
            probs[cut] = Sampler._cut_probs(logits[cut], [params[i] for i in cut])
        return probs

    @staticmethod
    def _cut_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Probabilities of tempered logits after top-k, then top-p. (C, vocab)"""
        device = logits.device
        vocab = logits.shape[-1]
        top_ks = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
        top_ps = torch.tensor([p.top_p for p in params], device=device)  # (C,)
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (C, vocab)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)  # (1, vocab)
        drop = ranks >= top_ks.clamp(max=vocab).unsqueeze(1)
        sorted_probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop |= mass_before >= top_ps.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        filtered = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        return torch.softmax(filtered, dim=-1)
