"""Shared fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from wok_runtime.core.block_manager import BlockManager


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """For correctness tests of torch code: one thread, because on a shared 2-core machine
    OpenMP threads that spin-wait for each other make every op several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def kv_blocks_never_leak(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BlockManager]]:
    """Every BlockManager made during a test must end it with all blocks free and consistent.

    Tests that hold blocks on purpose free them before they return, so a leak anywhere in the
    scheduler or engine (a finished, aborted, expired or failed request keeping its blocks) fails
    the test that caused it.
    """
    made: list[BlockManager] = []
    original = BlockManager.__init__

    def tracking_init(self: BlockManager, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(BlockManager, "__init__", tracking_init)
    yield made
    for manager in made:
        manager.check_invariants()
        assert manager.num_used_blocks == 0, f"{manager.num_used_blocks} KV blocks leaked"
