"""No module outside migrations is over 500 lines, and no function over 80, so that each can be
read at once. A module or function that must stay whole is an exception named in EXCEPTIONS
and, with why, in docs/architecture.md's "Size exceptions": the two lists are the same."""

from __future__ import annotations

import ast
import re
import subprocess

from tests.harness import ROOT

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# "path" for a module, "path::function" for a function (nested ones as outer.inner, methods as
# Class.method): each also listed in docs/architecture.md, with why it stays whole.
EXCEPTIONS: dict[str, str] = {}


def _python_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [path for path in listed.stdout.split() if "/migrations/" not in path and (ROOT / path).exists()]


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def oversized() -> dict[str, int]:
    """Every module and function over its limit, and its size in lines."""
    found: dict[str, int] = {}
    for path in _python_files():
        source = (ROOT / path).read_text()
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            found[path] = lines
        for name, size in _functions(ast.parse(source, filename=path)):
            if size > MAX_FUNCTION_LINES:
                found[f"{path}::{name}"] = size
    return found


def documented_exceptions() -> set[str]:
    """The entries of docs/architecture.md's "Size exceptions" list: its bullets' first code span."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Size exceptions", 1)[1].split("\n#", 1)[0]
    bullets = [line for line in section.splitlines() if line.startswith("- ")]
    if bullets == ["- None."]:
        return set()
    return {m.group(1) for line in bullets if (m := re.match(r"- `([^`]+)`", line))}


def test_no_module_or_function_is_over_its_limit_unless_it_is_an_exception():
    over = {name: size for name, size in oversized().items() if name not in EXCEPTIONS}
    assert not over, (
        f"over {MAX_MODULE_LINES} lines (module) or {MAX_FUNCTION_LINES} (function): split them, or name "
        f"them in EXCEPTIONS and in docs/architecture.md with why: {over}"
    )


def test_every_exception_is_still_oversized_and_documented():
    assert set(EXCEPTIONS) <= set(oversized()), "an exception that fits now: remove it from both lists"
    assert documented_exceptions() == set(EXCEPTIONS)


def test_the_measure_finds_a_long_function_and_names_it_by_its_class(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"class Run:\n    def step(self):\n{body}\n\n    def short(self):\n        pass\n")
    sizes = dict(_functions(tree))
    assert sizes["Run.step"] == MAX_FUNCTION_LINES + 1
    assert sizes["Run.short"] == 2
