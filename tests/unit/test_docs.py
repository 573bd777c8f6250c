"""The docs' own test: what README.md, docs/ and examples/ tell a reader must be true of this
repository. Links stay inside it, every `wok` command they show parses, the ones that can run
here print what they quote, and the text speaks of the project alone."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import get_args

import pytest
import yaml

from wok.cli import build_parser, main
from wok_contracts.traces import DEFAULT_SCRIPT
from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import plan_for_spec
from wok_runtime.core.model_config import ModelType
from wok_sim.cli import POLICIES
from wok_sim.columns import COLUMNS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Words that point at the project's history rather than at anything in the repository.
#: Nor do the paths of the machine the repository was worked on.
HISTORY = re.compile(
    r"issue ?[0-9]|\b(?:the|this|an?) issu[e]\b|issu[e]'s|issu[e] note|stop ?[0-9]+|\bbri[e]f\b"
    r"|/wor[k]/",
    re.IGNORECASE,
)
#: Folders that are not the project's text: version control, caches, build output.
NOT_SOURCE = {".git", ".venv", "build", "out", "__pycache__", "node_modules"}


def is_source(folder: str) -> bool:
    return not (folder in NOT_SOURCE or folder.startswith(".") or folder.endswith(".egg-info"))


def source_files() -> list[Path]:
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if is_source(name)]
        # A linked checkout's `.git` is a file naming where its repository lives.
        files += [Path(folder, name) for name in names if name != ".git"]
    return files


def test_the_repository_speaks_of_the_project_alone():
    hits = []
    for path in source_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue  # images and archives
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)


def test_every_relative_link_points_inside_the_repository():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def shown_commands() -> list[tuple[str, str]]:
    """Every `wok …` command line in the docs' code blocks, continuations joined, with where."""
    found = []
    for doc in DOCS:
        # A ```text block is what a command printed, not a command.
        blocks = re.findall(r"^```(?!text)[a-z]*\n(.*?)^```", doc.read_text(), re.M | re.S)
        for block in blocks:
            text = block.replace("\\\n", " ")
            for line in text.splitlines():
                line = line.strip().removeprefix("$ ")
                if re.match(r"wok [a-z-]+( |$)", line):  # not an error message: `wok runtime: …`
                    command = line.split("#")[0].strip().rstrip("&").strip()
                    found.append((doc.name, command))
    return found


@pytest.mark.parametrize(("doc", "command"), shown_commands())
def test_every_command_the_docs_show_parses(doc: str, command: str):
    # [--flag VALUE] marks an optional flag in a synopsis: parse it as given.
    argv = shlex.split(command.replace("[", "").replace("]", ""))[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as error:
        pytest.fail(f"{doc}: `{command}` does not parse (exit {error.code})")


def console_blocks(doc: Path) -> list[tuple[str, list[str]]]:
    """`$ wok …` commands of ```console blocks, each with the lines it is shown printing."""
    blocks = re.findall(r"^```console\n(.*?)^```", doc.read_text(), re.M | re.S)
    shown = []
    for block in blocks:
        lines = block.splitlines()
        if lines and lines[0].startswith("$ wok "):
            shown.append((lines[0].removeprefix("$ "), lines[1:]))
    return shown


#: A console block may elide part of what a command prints with a line of its own.
ELIDED = "[…]"
#: The commands whose console blocks run here, in a second each, and must print what they show.
RUNNABLE = ("wok budget", "wok plan")


def runnable_console_blocks() -> list[tuple[str, str, list[str]]]:
    return [
        (doc.name, command, printed)
        for doc in DOCS
        for command, printed in console_blocks(doc)
        if command.startswith(RUNNABLE)
    ]


def test_the_readme_and_the_simulate_doc_show_a_whole_wok_plan_to_copy():
    shown = {(doc, command.split()[1]) for doc, command, _ in runnable_console_blocks()}
    assert {("README.md", "plan"), ("simulate.md", "plan")} <= shown


@pytest.mark.parametrize(("doc", "command", "printed"), runnable_console_blocks())
def test_every_budget_and_plan_block_prints_what_it_shows(doc, command, printed, capsys):
    assert main(shlex.split(command)[1:]) == 0, f"{doc}: {command}"
    out = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line != ELIDED and line not in out] == [], doc
    if ELIDED not in printed:
        assert printed == out, f"{doc}: `{command}` shows part of its output without {ELIDED}"


def test_the_production_example_names_a_budget_command_that_shows_its_numbers(capsys):
    text = (ROOT / "examples" / "production.yaml").read_text()
    comment = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    [command] = re.findall(r"`(wok budget [^`]+)`", comment)
    spec = InferenceServiceSpec.model_validate(yaml.safe_load(text)["spec"])
    assert main([*shlex.split(command)[1:], "--json"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == plan_for_spec(spec).as_json()


def test_the_demo_is_a_quarter_hour_as_the_readme_says():
    assert sum(phase.seconds for phase in DEFAULT_SCRIPT) == 15 * 60
    readme = (ROOT / "README.md").read_text()
    assert "busy quarter-hour" in readme and "busy hour" not in readme


def test_the_simulate_doc_explains_every_column_and_policy_and_quotes_the_default_run():
    doc = (ROOT / "docs" / "simulate.md").read_text()
    for header, _ in COLUMNS:
        assert f"| `{header}` |" in doc, header
    for name in POLICIES:
        assert f"| `{name}` |" in doc, name
    # The run the doc quotes is what `wok simulate` with no flags runs.
    [flags] = re.findall(r"the same as `wok simulate ([^`]+)`", doc)
    explicit = vars(build_parser().parse_args(["simulate", *shlex.split(flags)]))
    default = vars(build_parser().parse_args(["simulate"]))
    assert {k: v for k, v in explicit.items() if k != "rate_scale"} == {
        k: v for k, v in default.items() if k != "rate_scale"
    }
    assert explicit["rate_scale"] == 3.0 and default["rate_scale"] is None


def default_run_in_the_simulate_doc() -> tuple[str, dict[str, dict[str, str]]]:
    """The sentence and the table rows (by policy, by column) the simulate doc quotes."""
    doc = (ROOT / "docs" / "simulate.md").read_text()
    sentence, table = re.findall(r"^```text\n(.*?)^```", doc, re.M | re.S)[0].split("\n\n")
    header, _, *rows = table.splitlines()
    columns = header.split()
    by_policy = {row.split()[0]: dict(zip(columns, row.split(), strict=True)) for row in rows}
    return " ".join(sentence.split()), by_policy


def test_the_simulate_doc_sentence_quotes_its_own_table():
    sentence, by_policy = default_run_in_the_simulate_doc()
    wok, peak, hpa = by_policy["wok"], by_policy["static-peak"], by_policy["hpa-waiting"]

    def share(row: dict[str, str]) -> str:
        return row["all"].replace("%", " %")

    assert sentence.startswith(
        f"wok served {share(wok)} of requests within every SLO on {wok['GPU-h']} GPU-hours; "
    )
    assert f"at batch {peak['B']}, {peak['GPU-h']} GPU-hours, for {share(peak)};" in sentence
    assert sentence.endswith(f"(hpa-waiting) served {share(hpa)} on {hpa['GPU-h']} GPU-hours.")


def test_the_readme_quotes_the_figures_of_the_default_run_in_the_simulate_doc():
    _, by_policy = default_run_in_the_simulate_doc()
    wok, peak = by_policy["wok"], by_policy["static-peak"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    share = wok["all"].removesuffix("%")
    assert (
        f"wok serves {share} % of requests within every SLO on {wok['GPU-h']} GPU-hours" in readme
    )
    peak_share = peak["all"].removesuffix("%")
    assert f"needs {peak['GPU-h']} GPU-hours for {peak_share} %" in readme


def test_the_batch_docs_example_input_line_is_valid(tmp_path, capsys):
    doc = (ROOT / "docs" / "batch.md").read_text()
    [line] = [block for block in re.findall(r"^```json\n(.*?)^```", doc, re.M | re.S)
              if '"method"' in block]  # fmt: skip
    (tmp_path / "in.jsonl").write_text(line)
    assert main(["batch", "validate", "--input", str(tmp_path / "in.jsonl")]) == 0
    assert "1 request, valid" in capsys.readouterr().out


def test_the_readme_gpu_status_matches_bench_results():
    readme = " ".join((ROOT / "README.md").read_text().split())
    top = readme[: readme.index("## Two commands")]
    for heading in ("**Models**", "**GPU status**", "**Prerequisites**", "**Images**"):
        assert heading in top, heading
    # The claim stands only while no GPU result has been written.
    report = ROOT / "bench" / "gpu" / "results" / "gpu_check.md"
    ran = report.is_file() and "not run on a GPU" not in report.read_text()
    if "nothing of wok has run on a GPU yet" in top:
        assert not ran, "bench/gpu/results holds a GPU run the README does not mention"
    else:
        assert ran, "the README claims a GPU run that bench/gpu/results does not hold"


def test_the_readme_at_a_glance_names_every_family_the_runtime_serves():
    readme = " ".join((ROOT / "README.md").read_text().split())
    top = readme[: readme.index("## Two commands")]
    [models] = re.findall(r"\*\*Models\*\*: (.*?)(?: - \*\*|$)", top)
    assert [t for t in get_args(ModelType) if f"`{t}`" not in models] == []
    assert "Llama-architecture" not in models
