"""The torch floor in pyproject.toml is the oldest release with every API the runtime calls:
each API below must still be used by the runtime (or leave the table), and the floor must be at
least the release that introduced it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

#: What the runtime calls that an older torch lacks, and the release that added it.
NEWEST_APIS = {
    "enable_gqa=": (2, 5),  # F.scaled_dot_product_attention(..., enable_gqa=True)
    "F.rms_norm(": (2, 4),
    "assign=True": (2, 1),  # Module.load_state_dict(..., assign=True)
}


def version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def test_the_floor_is_the_newest_api_the_runtime_calls():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [d for d in project["optional-dependencies"]["runtime"] if d.startswith("torch")]
    floor = version(spec.removeprefix("torch>="))
    source = "\n".join(p.read_text() for p in (ROOT / "runtime" / "wok_runtime").rglob("*.py"))
    for needle in NEWEST_APIS:
        assert needle in source, f"{needle!r} is no longer used: drop it from the table"
    assert floor == max(NEWEST_APIS.values()), spec
    assert version(torch.__version__) >= floor
