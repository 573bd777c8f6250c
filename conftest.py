"""The suite's tiers (docs/testing.md): every test is exactly one of unit, integration or e2e.

A module may mark itself; one that does not gets the tier of its directory. `make test` runs the
unit tier and the tests marked `serial` alone first, then the rest on several workers, one module
(or one xdist_group of modules) per worker, the modules marked `slow` first."""

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


# Before xdist's own hook, which reads the xdist_group marks into the work units.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(config.rootpath) and not any(
            item.get_closest_marker(tier) for tier in TIERS
        ):
            tier = directory_tier(item.path.relative_to(config.rootpath))
            if tier:
                item.add_marker(tier)
        # One work unit per module (--dist loadgroup): a module's fixtures start once. Modules
        # that share a named group run one after another on one worker, never side by side.
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    # The longest modules first (a stable sort keeps each module's tests together and in order):
    # a worker that picks one up last would end the parallel pass minutes after the others.
    minutes: dict[Path, float] = {}
    for item in items:
        minutes[item.path] = max(minutes.get(item.path, 0.0), slow_minutes(item))
    items.sort(key=lambda item: -minutes[item.path])


def slow_minutes(item: pytest.Item) -> float:
    """How long its module takes alone, from `pytest.mark.slow(minutes=...)`: 1 if unsaid."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.kwargs.get("minutes", 1))
