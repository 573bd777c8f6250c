"""Paged KV-cache bookkeeping: which fixed-size blocks of the model runner's KV pool each
sequence owns.

The pool is sized once, at start, by the model runner (`runner.num_blocks`); this class only hands
out block indices and takes them back. Pure Python, so its invariants (no block owned twice, no
block lost) are property-tested in milliseconds.

Optional per-tenant quota: with `tenant_kv_share < 1`, one tenant may hold at most that share of
the pool. A tenant at its quota waits (or preempts its own sequences) instead of taking blocks from
another tenant. Requests without a tenant count as the tenant `""`.
"""

from __future__ import annotations

import math
from collections import deque

from wok_runtime.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, tenant_kv_share: float = 1.0) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 < tenant_kv_share <= 1.0:
            raise ValueError(f"tenant_kv_share must be in (0, 1], got {tenant_kv_share}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.tenant_kv_share = tenant_kv_share
        self.tenant_quota_blocks = max(1, math.floor(tenant_kv_share * num_blocks))
        self._free: deque[int] = deque(range(num_blocks))
        self._owner: dict[int, str] = {}  # block index -> request id
        self._tenant_used: dict[str, int] = {}

    # --- figures ----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def tenant_used_blocks(self, tenant: str | None) -> int:
        return self._tenant_used.get(tenant or "", 0)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- allocation -------------------------------------------------------------------------

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks to add to `seq`'s table so that it covers positions [0, num_tokens)."""
        return max(0, self.blocks_for_tokens(num_tokens) - len(seq.block_table))

    def tenant_blocked(self, seq: Sequence, num_tokens: int) -> bool:
        """True when growing `seq` to `num_tokens` would take its tenant over its quota."""
        need = self.blocks_needed(seq, num_tokens)
        return self.tenant_used_blocks(seq.tenant) + need > self.tenant_quota_blocks

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        need = self.blocks_needed(seq, num_tokens)
        return need <= len(self._free) and not self.tenant_blocked(seq, num_tokens)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grows `seq`'s block table to cover positions [0, num_tokens)."""
        if not self.can_allocate(seq, num_tokens):
            raise RuntimeError(f"cannot allocate {num_tokens} tokens for {seq.request_id}")
        need = self.blocks_needed(seq, num_tokens)
        key = seq.tenant or ""
        for _ in range(need):
            block = self._free.popleft()
            assert block not in self._owner, f"block {block} is free and owned"
            self._owner[block] = seq.request_id
            seq.block_table.append(block)
        self._tenant_used[key] = self._tenant_used.get(key, 0) + need

    def can_append_slot(self, seq: Sequence) -> bool:
        return self.can_allocate(seq, seq.num_computed_tokens + 1)

    def append_slot(self, seq: Sequence) -> None:
        """Room for one more token (a decode step) after the computed ones."""
        self.allocate(seq, seq.num_computed_tokens + 1)

    def free(self, seq: Sequence) -> None:
        """Returns all of `seq`'s blocks to the pool (idempotent)."""
        if not seq.block_table:
            return
        key = seq.tenant or ""
        for block in seq.block_table:
            owner = self._owner.pop(block, None)
            assert owner == seq.request_id, f"block {block} owned by {owner}, not {seq.request_id}"
            self._free.append(block)
        self._tenant_used[key] -= len(seq.block_table)
        assert self._tenant_used[key] >= 0
        if self._tenant_used[key] == 0:
            del self._tenant_used[key]
        seq.block_table = []

    def check_invariants(self) -> None:
        """Every block is either free or owned by exactly one request (for tests)."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not (free & self._owner.keys()), "a block is both free and owned"
        assert len(free) + len(self._owner) == self.num_blocks, "a block was lost"
        assert sum(self._tenant_used.values()) == len(self._owner)
