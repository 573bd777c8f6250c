"""The suite's tiers (docs/testing.md): every test is exactly one of unit, integration or e2e.

A module may mark itself; one that does not gets the tier of its directory. `make test` runs the
unit tier and the tests marked `serial` alone first, then the rest on several workers, one module
per worker, the modules marked `slow` first."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e")
TIER_OF_DIRECTORY = {
    Path("tests/unit"): "unit",
    Path("tests/integration"): "integration",
    Path("e2e"): "e2e",
}


def directory_tier(path: Path) -> str | None:
    """The tier of a test file by where it lives (relative to the repository), if any."""
    return next((t for d, t in TIER_OF_DIRECTORY.items() if path.is_relative_to(d)), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        if item.path.is_relative_to(config.rootpath):
            tier = directory_tier(item.path.relative_to(config.rootpath))
            if tier:
                item.add_marker(tier)
    # Long modules first (a stable sort keeps each module's tests together and in order): a
    # worker that picks one up last would end the parallel pass minutes after the others.
    long_modules = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in long_modules)
