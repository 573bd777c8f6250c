"""The sampler: greedy rows batched, top-k / top-p filters, per-request seeds, poisoned rows."""

from __future__ import annotations

import pytest
import torch

from wok_runtime.core.sampler import Sampler
from wok_runtime.core.sampling_params import SamplingParams


def logits_rows(n: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_argmax_and_a_nan_row_is_none() -> None:
    logits = logits_rows(3)
    logits[1, 5] = float("nan")
    greedy = SamplingParams()
    got = Sampler().sample(logits, [("a", greedy), ("b", greedy), ("c", greedy)])
    assert got == [int(logits[0].argmax()), None, int(logits[2].argmax())]


def test_top_k_one_and_tiny_top_p_reduce_to_greedy() -> None:
    logits = logits_rows(4, seed=1)
    sampler = Sampler(seed=0)
    params = [SamplingParams(temperature=1.5, top_k=1), SamplingParams(temperature=1.5, top_p=1e-6)]
    for _ in range(20):
        got = sampler.sample(logits[:2], [("a", params[0]), ("b", params[1])])
        assert got == [int(logits[0].argmax()), int(logits[1].argmax())]


def test_top_k_never_picks_outside_the_k_best() -> None:
    logits = logits_rows(1, vocab=100, seed=2)
    best = set(logits[0].topk(5).indices.tolist())
    sampler = Sampler(seed=0)
    params = SamplingParams(temperature=5.0, top_k=5)
    picks = {sampler.sample(logits, [(f"r{i}", params)])[0] for i in range(200)}
    assert picks <= best and len(picks) > 1


def test_a_seed_reproduces_a_request_whatever_its_neighbours() -> None:
    logits = logits_rows(3, seed=3)
    seeded = SamplingParams(temperature=1.0, seed=42)
    free = SamplingParams(temperature=1.0)
    alone = [Sampler().sample(logits[:1], [("x", seeded)])[0] for _ in range(1)]
    crowd = Sampler().sample(logits, [("x", seeded), ("y", free), ("z", free)])
    assert crowd[0] == alone[0]
    # the request's generator advances across steps, and is dropped on release
    sampler = Sampler()
    first = [sampler.sample(logits[:1], [("x", seeded)])[0] for _ in range(8)]
    sampler.release("x")
    again = [sampler.sample(logits[:1], [("x", seeded)])[0] for _ in range(8)]
    assert first == again and len(set(first)) > 1


def test_only_the_rows_that_cut_sort_the_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row without top-k or top-p must not pay for a sort of the whole vocabulary."""
    sorted_shapes: list[tuple[int, ...]] = []
    real_sort = torch.Tensor.sort

    def counting_sort(self: torch.Tensor, *args: object, **kwargs: object) -> object:
        sorted_shapes.append(tuple(self.shape))
        return real_sort(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", counting_sort)
    logits = logits_rows(3, vocab=64, seed=4)
    free = SamplingParams(temperature=1.0)
    top_k_one = SamplingParams(temperature=1.0, top_k=1)
    sampler = Sampler(seed=0)
    sampler.sample(logits, [("a", free), ("b", free), ("c", free)])
    assert sorted_shapes == []
    got = sampler.sample(logits, [("a", free), ("b", top_k_one), ("c", free)])
    assert sorted_shapes == [(1, 64)] and got[1] == int(logits[1].argmax())


def test_rows_that_do_not_cut_draw_from_the_tempered_softmax() -> None:
    logits = logits_rows(2, vocab=64, seed=5)
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_p=0.5)]
    probs = Sampler._filtered_probs(logits, params)
    torch.testing.assert_close(probs[0], torch.softmax(logits[0] / 0.7, dim=-1))
    assert int((probs[1] > 0).sum()) < 64 and abs(float(probs[1].sum()) - 1.0) < 1e-5


def test_draws_follow_the_distribution_and_never_pick_a_token_without_mass() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]]).repeat(500, 1)
    cut = SamplingParams(temperature=1.0, top_k=3)  # the last token has no mass
    sampler = Sampler(seed=0)
    picks = [
        token
        for _ in range(8)
        for token in sampler.sample(logits, [(f"r{i}", cut) for i in range(500)])
    ]
    counts = torch.bincount(torch.tensor(picks), minlength=4).float() / len(picks)
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.5]), dim=-1)
    assert counts[3] == 0
    torch.testing.assert_close(counts[:3], expected, atol=0.02, rtol=0)
