"""The KV block allocator: no block is ever lost or owned twice, quotas hold, figures add up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wok_runtime.core.block_manager import BlockManager
from wok_runtime.core.sampling_params import SamplingParams
from wok_runtime.core.sequence import Sequence


def make_seq(request_id: str, tenant: str | None = None, num_tokens: int = 1) -> Sequence:
    return Sequence(
        request_id=request_id,
        prompt_token_ids=[1] * num_tokens,
        params=SamplingParams(),
        arrival_time=0.0,
        tenant=tenant,
    )


def test_allocate_covers_positions_and_free_returns_everything() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a")
    bm.allocate(seq, 5)  # positions 0..4 need two blocks of four
    assert len(seq.block_table) == 2
    assert bm.num_used_blocks == 2 and bm.num_free_blocks == 6
    assert bm.usage == pytest.approx(0.25)
    bm.allocate(seq, 8)  # still two blocks
    assert len(seq.block_table) == 2
    seq.num_computed_tokens = 8
    assert bm.can_allocate(seq, 9)
    bm.allocate(seq, 9)  # position 8 opens a third block
    assert len(seq.block_table) == 3
    bm.free(seq)
    bm.free(seq)  # idempotent
    assert seq.block_table == [] and bm.num_free_blocks == 8
    bm.check_invariants()


def test_cannot_allocate_beyond_the_pool() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    a, b = make_seq("a"), make_seq("b")
    bm.allocate(a, 8)
    assert not bm.can_allocate(b, 1)
    with pytest.raises(RuntimeError):
        bm.allocate(b, 1)
    bm.free(a)
    assert bm.can_allocate(b, 8)


def test_tenant_quota_blocks_one_tenant_but_not_another() -> None:
    bm = BlockManager(num_blocks=10, block_size=1, tenant_kv_share=0.5)
    assert bm.tenant_quota_blocks == 5
    a1, a2, b1 = make_seq("a1", "A"), make_seq("a2", "A"), make_seq("b1", "B")
    bm.allocate(a1, 4)
    assert bm.tenant_blocked(a2, 2)  # 4 + 2 > 5
    assert not bm.can_allocate(a2, 2)
    assert bm.can_allocate(a2, 1)
    assert bm.can_allocate(b1, 5)  # the other tenant has its own share
    assert bm.tenant_used_blocks("A") == 4 and bm.tenant_used_blocks("B") == 0
    bm.free(a1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": 0},
        {"num_blocks": 4, "block_size": 0},
        {"num_blocks": 4, "tenant_kv_share": 0.0},
    ],
)
def test_rejects_bad_sizes(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        BlockManager(**kwargs)


operations = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "free", "append"]),
        st.integers(0, 5),  # which sequence
        st.integers(1, 40),  # tokens
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    num_blocks=st.integers(1, 24),
    block_size=st.integers(1, 8),
    share=st.sampled_from([1.0, 0.5, 0.3]),
    ops=operations,
)
def test_property_blocks_are_conserved(
    num_blocks: int, block_size: int, share: float, ops: list[tuple[str, int, int]]
) -> None:
    bm = BlockManager(num_blocks, block_size, tenant_kv_share=share)
    seqs = [make_seq(f"s{i}", tenant=f"t{i % 2}") for i in range(6)]
    for op, i, n in ops:
        seq = seqs[i]
        if op == "alloc":
            before = len(seq.block_table)
            if bm.can_allocate(seq, n):
                bm.allocate(seq, n)
                assert len(seq.block_table) >= bm.blocks_for_tokens(n)
            else:
                with pytest.raises(RuntimeError):
                    bm.allocate(seq, n)
                assert len(seq.block_table) == before
        elif op == "append":
            seq.num_computed_tokens = len(seq.block_table) * block_size
            if bm.can_allocate(seq, seq.num_computed_tokens + 1):
                bm.allocate(seq, seq.num_computed_tokens + 1)
        else:
            bm.free(seq)
        bm.check_invariants()
        owned = [b for s in seqs for b in s.block_table]
        assert len(owned) == len(set(owned)) == bm.num_used_blocks
        assert bm.num_used_blocks + bm.num_free_blocks == num_blocks
        for tenant in ("t0", "t1"):
            assert bm.tenant_used_blocks(tenant) <= bm.tenant_quota_blocks
    for seq in seqs:
        bm.free(seq)
    assert bm.num_free_blocks == num_blocks


# --- automatic prefix caching ------------------------------------------------------------------


def prompt_seq(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(
        request_id=request_id, prompt_token_ids=tokens, params=SamplingParams(), arrival_time=0.0
    )


def compute(bm: BlockManager, seq: Sequence, num_tokens: int) -> None:
    """Admits `seq` (from its cached prefix) and runs it to `num_tokens`, as the scheduler does."""
    bm.allocate(seq, num_tokens)
    start = seq.num_computed_tokens
    seq.num_computed_tokens = num_tokens
    bm.cache_computed(seq, start)


def test_a_new_sequence_shares_the_blocks_of_its_longest_cached_prefix() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = prompt_seq("a", list(range(1, 11)))  # 10 tokens: two full blocks and two tokens
    compute(bm, a, 10)
    b = prompt_seq("b", [*range(1, 9), 50, 51, 52, 53, 54])  # the first 8 tokens are a's
    assert bm.num_cached_tokens(b) == 8
    assert bm.blocks_needed(b, 13) == 2  # a holds the shared two: only the rest is new
    bm.allocate(b, 13)
    assert b.num_computed_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2:] != a.block_table[2:]
    assert bm.num_used_blocks == 3 + 2
    c = prompt_seq("c", [2, *range(2, 12)])  # differs in the first token: no hit at all
    assert bm.num_cached_tokens(c) == 0
    assert (bm.prefix_queries, bm.prefix_hits) == (10 + 13, 8)
    bm.check_invariants()
    bm.free(a)
    bm.free(b)


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = prompt_seq("a", list(range(1, 9)))
    compute(bm, a, 8)
    bm.free(a)
    # The logits of the last token give the first output token: the last block is computed again.
    assert bm.num_cached_tokens(prompt_seq("b", list(range(1, 9)))) == 4
    assert bm.num_cached_tokens(prompt_seq("c", list(range(1, 10)))) == 8


def test_a_shared_block_is_freed_only_when_nothing_holds_it_and_stays_cached() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a = prompt_seq("a", list(range(1, 10)))
    compute(bm, a, 9)
    b = prompt_seq("b", list(range(1, 10)))
    bm.allocate(b, 9)
    assert b.block_table[:2] == a.block_table[:2]
    bm.free(a)
    assert bm.num_used_blocks == 3  # b's own last block and the two it shares
    bm.free(b)
    assert bm.num_used_blocks == 0
    c = prompt_seq("c", list(range(1, 10)))
    assert bm.num_cached_tokens(c) == 8  # freed, yet still a hit
    assert bm.blocks_needed(c, 9) == 3  # free blocks taken back from the free list cost one each


def test_allocation_overwrites_the_least_recently_freed_cached_block_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    old, new = prompt_seq("old", [1, 2, 3]), prompt_seq("new", [7, 8, 9])
    compute(bm, old, 3)
    compute(bm, new, 3)
    bm.free(old)
    bm.free(new)
    # Four free blocks: the two partial ones (cached nothing) go first, then old's, then new's.
    filler = prompt_seq("filler", [5, 5, 5, 5, 5, 5])
    bm.allocate(filler, 5)
    assert bm.num_cached_tokens(prompt_seq("x", [1, 2, 3])) == 0
    assert bm.num_cached_tokens(prompt_seq("y", [7, 8, 9])) == 2
    bm.free(filler)


def test_without_prefix_caching_nothing_is_shared_or_counted() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, prefix_caching=False)
    a = prompt_seq("a", list(range(1, 10)))
    compute(bm, a, 9)
    b = prompt_seq("b", list(range(1, 10)))
    assert bm.num_cached_tokens(b) == 0
    bm.allocate(b, 9)
    assert not set(a.block_table) & set(b.block_table)
    assert (bm.prefix_queries, bm.prefix_hits) == (0, 0)
    bm.free(a)
    bm.free(b)


def test_a_tenant_quota_counts_a_shared_block_once() -> None:
    bm = BlockManager(num_blocks=10, block_size=4, tenant_kv_share=0.5)
    a = Sequence("a", list(range(1, 10)), SamplingParams(), 0.0, tenant="A")
    compute(bm, a, 9)  # three blocks of tenant A's five
    b = Sequence("b", list(range(1, 10)), SamplingParams(), 0.0, tenant="A")
    assert not bm.tenant_blocked(b, 9)  # the two it shares are A's already: one more
    bm.allocate(b, 9)
    assert bm.tenant_used_blocks("A") == 4
    c = Sequence("c", list(range(1, 10)), SamplingParams(), 0.0, tenant="B")
    bm.allocate(c, 9)
    assert bm.tenant_used_blocks("B") == 3  # B holds the shared blocks too: they count for it
    for seq in (a, b, c):
        bm.free(seq)
    assert bm.tenant_used_blocks("A") == bm.tenant_used_blocks("B") == 0


@settings(max_examples=200, deadline=None)
@given(
    num_blocks=st.integers(1, 24),
    block_size=st.integers(1, 4),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["compute", "free"]),
            st.integers(0, 5),  # which sequence
            st.integers(1, 12),  # up to which position
        ),
        max_size=60,
    ),
)
def test_property_shared_blocks_hold_their_prefix_and_are_never_lost(
    num_blocks: int, block_size: int, ops: list[tuple[str, int, int]]
) -> None:
    """Prompts that share prefixes of many lengths; a slot store stands in for the K/V pool, so
    a hit on a block that holds other tokens (or a block lost or held twice) is seen."""
    bm = BlockManager(num_blocks, block_size)
    slots: dict[int, int] = {}  # slot -> the token whose K/V was written there
    seqs = [
        prompt_seq(f"s{i}", [1] * k + [2] * (12 - k)) for i, k in enumerate([12, 12, 8, 5, 0, 3])
    ]
    for op, i, n in ops:
        seq = seqs[i]
        if op == "free":
            bm.free(seq)
            seq.num_computed_tokens = 0
        elif n > seq.num_computed_tokens and bm.can_allocate(seq, n):
            bm.allocate(seq, n)
            start = seq.num_computed_tokens
            table = seq.block_table
            for p in range(n):
                slot = table[p // block_size] * block_size + p % block_size
                if p >= start:
                    slots[slot] = seq.token_ids[p]  # computed now
                assert slots.get(slot) == seq.token_ids[p], "a block holds another prefix"
            seq.num_computed_tokens = n
            bm.cache_computed(seq, start)
        bm.check_invariants()
        held = {b for s in seqs for b in s.block_table}
        assert len(held) == bm.num_used_blocks
        assert bm.num_used_blocks + bm.num_free_blocks == num_blocks
    for seq in seqs:
        bm.free(seq)
    assert bm.num_free_blocks == num_blocks
