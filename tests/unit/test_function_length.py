"""Long functions: at most five in the project's code (bench/ included, tests not), and each one
says why it reads best whole.

A reader takes in a function of a screen or so at once; past that, named steps say what a body
does before one reads it. A function over `MAX_LINES` lines (its `def` line to its last, the
decorators not counted) carries a comment line `# long: <why>` between its `def` and its first
statement after the docstring, e.g. a flat table of flags, or a rule that splitting would hide.
"""

from __future__ import annotations

import ast
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
MAX_LONG = 5
MARK = "# long:"
#: Folders that hold no product code: tests, end-to-end scenarios, environments, build output.
NOT_PRODUCT = {"tests", "e2e", ".venv", "build", "__pycache__", "node_modules"}


@dataclass(frozen=True)
class LongFunction:
    where: str  # path:line of its `def`
    name: str
    lines: int
    why: str | None  # the text after `# long:`; None: it does not say


def product_files() -> list[Path]:
    """Every Python file outside the tests, e2e/ and environments (bench/ included)."""
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [
            name
            for name in subfolders
            if name not in NOT_PRODUCT
            and not name.startswith(".")
            and not name.endswith(".egg-info")
        ]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    return sorted(files)


def stated_why(function: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> str | None:
    """The reason a `# long:` comment gives between the `def` and the first statement after the
    docstring (None where no such comment, or an empty one)."""
    body = function.body
    has_docstring = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    first = body[1] if has_docstring and len(body) > 1 else body[0]
    for line in lines[function.lineno - 1 : first.lineno - 1]:
        text = line.strip()
        if text.startswith(MARK) and text.removeprefix(MARK).strip():
            return text.removeprefix(MARK).strip()
    return None


def long_functions(source: str, path: str) -> list[LongFunction]:
    """The functions and methods (nested ones too) of `source` over `MAX_LINES` lines."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                why = stated_why(node, lines)
                found.append(LongFunction(f"{path}:{node.lineno}", node.name, length, why))
    return found


def project_long_functions() -> list[LongFunction]:
    found = []
    for path in product_files():
        found += long_functions(path.read_text(), str(path.relative_to(ROOT)))
    return sorted(found, key=lambda f: -f.lines)


def listed(functions: list[LongFunction]) -> str:
    return "\n".join(
        f"{f.lines} lines: {f.where} {f.name} ({f.why or 'no # long:'})" for f in functions
    )


def function_of(lines: int, *, head: str = "") -> str:
    """A function of exactly `lines` lines, `head` its first lines after the `def`."""
    top = ["def f():", *("    " + line for line in head.splitlines())]
    return "\n".join([*top, *["    x = 1"] * (lines - len(top))]) + "\n"


def test_a_function_over_the_limit_is_found_and_its_reason_read():
    assert long_functions(function_of(MAX_LINES), "a.py") == []
    [bare] = long_functions(function_of(MAX_LINES + 1), "a.py")
    assert (bare.where, bare.name, bare.lines, bare.why) == ("a.py:1", "f", MAX_LINES + 1, None)
    said = function_of(MAX_LINES + 1, head='"""Doc."""\n# long: one flat table')
    assert long_functions(said, "a.py")[0].why == "one flat table"
    # Only before the first statement: a `# long:` further down is some other comment.
    late = function_of(MAX_LINES + 1, head='"""Doc."""\nx = 0\n# long: too late')
    assert long_functions(late, "a.py")[0].why is None
    assert long_functions(function_of(MAX_LINES + 1, head="# long:"), "a.py")[0].why is None


def test_a_long_method_or_nested_function_counts_too():
    method = "class C:\n" + textwrap.indent(function_of(MAX_LINES + 1), "    ")
    assert [f.name for f in long_functions(method, "a.py")] == ["f"]
    nested = "def outer():\n" + textwrap.indent(function_of(MAX_LINES + 1), "    ")
    assert [f.name for f in long_functions(nested, "a.py")] == ["outer", "f"]


def test_the_walk_covers_the_packages_and_bench_but_not_the_tests():
    files = {str(p.relative_to(ROOT)) for p in product_files()}
    assert "operator/wok_operator/control.py" in files and "wok/cli.py" in files
    assert any(f.startswith("bench/") for f in files)
    assert not any(f.startswith(("tests/", "e2e/", ".venv/")) for f in files)


def test_at_most_five_functions_run_over_80_lines():
    found = project_long_functions()
    message = f"{len(found)} functions over {MAX_LINES} lines:\n{listed(found)}"
    assert len(found) <= MAX_LONG, message


def test_every_function_over_80_lines_says_why():
    unexplained = [f for f in project_long_functions() if f.why is None]
    message = f"no `{MARK} <why>` comment before the first statement:\n{listed(unexplained)}"
    assert not unexplained, message
