"""Paged KV-cache bookkeeping: which fixed-size blocks of the model runner's KV pool each
sequence holds, and which of them hold a prefix that a later request may reuse.

The pool is sized once, at start, by the model runner (`runner.num_blocks`); this class only hands
out block indices and takes them back. Pure Python, so its invariants (no block lost, a block free
or referenced, never both) are property-tested in milliseconds.

Automatic prefix caching (as vLLM's): once a full block's K/V is computed, the block is published
under a hash of its tokens chained with the hash of the block before it, so one hash names a whole
prefix. A new sequence starts from the blocks of its longest published prefix, shared by
reference count, and skips their prefill. A block nothing references goes back to the free list
with its contents; a hit takes it back from there, and only allocation, least recently freed
first, overwrites it. Sha-256, not Python's `hash`: a crafted prompt must not collide with another
request's prefix and read its K/V.

Optional per-tenant quota: with `tenant_kv_share < 1`, one tenant may hold at most that share of
the pool. A tenant at its quota waits (or preempts its own sequences) instead of taking blocks from
another tenant. Requests without a tenant count as the tenant `""`. A block shared by two tenants
counts for each of them, once.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from array import array
from collections import OrderedDict

from wok_runtime.core.sequence import Sequence


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """The hash of a full block: its tokens and, through `parent`, every token before them."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        tenant_kv_share: float = 1.0,
        *,
        prefix_caching: bool = True,
    ) -> None:
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
        self.prefix_caching = prefix_caching
        # Least recently freed first: allocation takes from the front, so a cached block
        # survives as long as the free list allows.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs: dict[int, int] = {}  # block -> how many block tables hold it (>= 1)
        self._cached: dict[bytes, int] = {}  # prefix hash -> the block that holds it
        self._hash_of: dict[int, bytes] = {}  # the reverse
        self._tenant_refs: dict[tuple[str, int], int] = {}  # (tenant, block) -> its tables
        self._tenant_used: dict[str, int] = {}  # tenant -> distinct blocks it holds
        # vLLM's prefix-cache counters, of the online lane as every vLLM series (metrics.py):
        # prompt tokens looked up at first admission, and how many of them were found cached
        # (a preempted sequence's readmission counts in neither).
        self.prefix_queries = 0
        self.prefix_hits = 0

    # --- figures ----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached ones included: allocation may overwrite them)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def holders(self, block: int) -> int:
        """How many block tables hold `block` (0: it is free)."""
        return self._refs.get(block, 0)

    def tenant_used_blocks(self, tenant: str | None) -> int:
        return self._tenant_used.get(tenant or "", 0)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- prefix cache -----------------------------------------------------------------------

    def num_cached_tokens(self, seq: Sequence) -> int:
        """Tokens of `seq` that its admission will take from the cache instead of computing."""
        return len(self._cached_prefix(seq)) * self.block_size

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """The blocks of `seq`'s longest cached prefix, for a sequence that holds none yet. The
        last token is always left to compute: its logits give the next token."""
        if not self.prefix_caching or seq.block_table:
            return []
        blocks: list[int] = []
        most = (seq.num_tokens - 1) // self.block_size
        for h in itertools.islice(self._hashes(seq, most), most):
            block = self._cached.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The chained hashes of `seq`'s full blocks, at least its first `num_blocks`, kept on
        the sequence: its tokens are only ever appended, so a full block's hash never changes."""
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else b""
            hashes.append(block_hash(parent, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes

    def cache_computed(self, seq: Sequence, start_pos: int) -> None:
        """Publishes the blocks that a step from `start_pos` to `seq.num_computed_tokens` has
        filled, so that later sequences with the same prefix reuse them."""
        first, full = start_pos // self.block_size, seq.num_computed_tokens // self.block_size
        if not self.prefix_caching or first == full:  # no block filled (most decode steps)
            return
        hashes = self._hashes(seq, full)
        for i in range(first, full):
            block, h = seq.block_table[i], hashes[i]
            # Two sequences that computed the same block at once: the first one stays published.
            if h not in self._cached and block not in self._hash_of:
                self._cached[h] = block
                self._hash_of[block] = h

    # --- allocation -------------------------------------------------------------------------

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Free blocks that covering positions [0, num_tokens) of `seq` takes: its cached prefix
        costs none where another sequence holds it already."""
        growth = self._table_growth(seq, num_tokens)
        if seq.block_table or not self.prefix_caching:  # no prefix to look up (a decode)
            return growth
        hits = self._cached_prefix(seq)[: num_tokens // self.block_size]
        return growth - sum(block in self._refs for block in hits)

    def _table_growth(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, self.blocks_for_tokens(num_tokens) - len(seq.block_table))

    def tenant_blocked(self, seq: Sequence, num_tokens: int) -> bool:
        """True when growing `seq` to `num_tokens` would take its tenant over its quota."""
        key = seq.tenant or ""
        need = self._table_growth(seq, num_tokens)
        if not seq.block_table and self.prefix_caching:
            hits = self._cached_prefix(seq)[: num_tokens // self.block_size]
            need -= sum((key, block) in self._tenant_refs for block in hits)
        return self._tenant_used.get(key, 0) + need > self.tenant_quota_blocks

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        need = self.blocks_needed(seq, num_tokens)
        return need <= len(self._free) and not self.tenant_blocked(seq, num_tokens)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grows `seq`'s block table to cover positions [0, num_tokens). A sequence that holds no
        block yet starts with its cached prefix (up to `num_tokens`), and its
        `num_computed_tokens` moves past it."""
        if not self.can_allocate(seq, num_tokens):
            raise RuntimeError(f"cannot allocate {num_tokens} tokens for {seq.request_id}")
        key = seq.tenant or ""
        if not seq.block_table:
            hits = self._cached_prefix(seq)[: num_tokens // self.block_size]
            for block in hits:
                self._take(block, key)
            seq.block_table.extend(hits)
            seq.num_computed_tokens = len(hits) * self.block_size
            if self.prefix_caching and seq.num_preemptions == 0 and not seq.is_batch:
                self.prefix_queries += seq.num_tokens
                self.prefix_hits += seq.num_computed_tokens
        while len(seq.block_table) < self.blocks_for_tokens(num_tokens):
            block = next(iter(self._free))
            h = self._hash_of.pop(block, None)
            if h is not None:  # the least recently freed cached block is overwritten
                del self._cached[h]
            self._take(block, key)
            seq.block_table.append(block)

    def _take(self, block: int, tenant: str) -> None:
        if block in self._free:
            del self._free[block]
        self._refs[block] = self._refs.get(block, 0) + 1
        held = self._tenant_refs.get((tenant, block), 0)
        if held == 0:
            self._tenant_used[tenant] = self._tenant_used.get(tenant, 0) + 1
        self._tenant_refs[tenant, block] = held + 1

    def _drop(self, block: int, tenant: str) -> None:
        held = self._tenant_refs.pop((tenant, block))
        if held > 1:
            self._tenant_refs[tenant, block] = held - 1
        else:
            self._tenant_used[tenant] -= 1
            if self._tenant_used[tenant] == 0:
                del self._tenant_used[tenant]
        refs = self._refs.pop(block)
        if refs > 1:
            self._refs[block] = refs - 1
            return
        self._free[block] = None
        if block not in self._hash_of:  # holds nothing reusable: the first to go
            self._free.move_to_end(block, last=False)

    def free(self, seq: Sequence) -> None:
        """Drops `seq`'s hold on its blocks (idempotent). A block nothing else holds becomes
        free, its cached contents kept for a later hit."""
        if not seq.block_table:
            return
        # The tail first: it goes before the prefix it extends when the pool runs short.
        for block in reversed(seq.block_table):
            self._drop(block, seq.tenant or "")
        seq.block_table = []

    def check_invariants(self) -> None:
        """Every block is either free or held, and the cache's two maps agree (for tests)."""
        assert not (self._free.keys() & self._refs.keys()), "a block is both free and held"
        assert len(self._free) + len(self._refs) == self.num_blocks, "a block was lost"
        assert all(refs >= 1 for refs in self._refs.values())
        assert sum(self._tenant_refs.values()) == sum(self._refs.values())
        assert sum(self._tenant_used.values()) == len(self._tenant_refs)
        assert {b: h for h, b in self._cached.items()} == self._hash_of
