"""The KV block allocator: no block is ever lost or owned twice, quotas hold, figures add up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wok_runtime.block_manager import BlockManager
from wok_runtime.sampling_params import SamplingParams
from wok_runtime.sequence import Sequence


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
    assert bm.can_append_slot(seq)
    bm.append_slot(seq)  # position 8 opens a third block
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
            if bm.can_append_slot(seq):
                bm.append_slot(seq)
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
