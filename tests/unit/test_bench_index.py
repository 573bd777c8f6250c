"""bench/README.md, the index of the benchmarks: every file under a study's results/ folder is named
in that study's section, and every script or file the index names exists."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
INDEX = BENCH / "README.md"
#: A study's section opens with its folder as the heading: `## autoscaling/`.
SECTION = re.compile(r"^## ([\w-]+)/$", re.M)


def sections(text: str) -> dict[str, str]:
    """Each study's section of the index, by its folder name."""
    heads = list(SECTION.finditer(text))
    ends = [head.start() for head in heads[1:]] + [len(text)]
    return {head[1]: text[head.end() : end] for head, end in zip(heads, ends, strict=True)}


def named(section: str) -> set[str]:
    """What a section names: its `quoted` words without spaces, and its links' texts."""
    return set(re.findall(r"`([^`\s]+)`", section)) | set(re.findall(r"\[([^\]]+)\]\(", section))


def result_folders() -> list[Path]:
    return sorted(path for path in BENCH.glob("*/results") if path.is_dir())


def test_every_study_with_results_has_a_section_and_every_section_a_folder():
    studies = sections(INDEX.read_text())
    assert {folder.parent.name for folder in result_folders()} <= studies.keys()
    assert [name for name in studies if not (BENCH / name).is_dir()] == []


def test_every_result_file_is_named_in_its_study_section():
    studies = sections(INDEX.read_text())
    missing = [
        f"{folder.parent.name}/results/{path.name}"
        for folder in result_folders()
        for path in sorted(folder.iterdir())
        if path.name not in named(studies.get(folder.parent.name, ""))
    ]
    assert not missing, f"bench/README.md does not name: {missing}"


def test_every_script_and_link_the_index_names_exists():
    text = INDEX.read_text()
    studies = sections(text)
    absent = [
        f"{study}/{name}"
        for study, section in studies.items()
        for name in named(section)
        if re.fullmatch(r"[\w-]+\.py", name) and not (BENCH / study / name).is_file()
    ]
    absent += [
        path
        for path in re.findall(r"\b(bench/[\w/.-]+\.py)\b", text)
        if not (BENCH.parent / path).is_file()
    ]
    absent += [
        target
        for target in re.findall(r"\]\(([^)#\s]+)\)", text)
        if not (INDEX.parent / target).exists()
    ]
    assert not absent, f"bench/README.md names what does not exist: {absent}"
