"""Reading the documentation and the code for the docs tests (tests/test_docs_variables.py,
tests/test_docs_commands.py): the pages, their sections, tables and code, and the production
code's syntax trees. Files only: no server, no subprocess."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("clockq", "workers", "webapp", "control", "predictor", "clockq_cli")
PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))


def python_files(*folders: str) -> Iterator[Path]:
    """The Python files under the folders, migrations left out."""
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def called(call: ast.Call) -> str | None:
    """The name a call calls: `f` of `f(...)` and of `module.f(...)`."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


@cache
def strings_of_the_code() -> frozenset[str]:
    """Every string constant of the production code."""
    return frozenset(
        node.value
        for path in python_files(*PRODUCTION)
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def page_text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def code_of(text: str) -> list[str]:
    """Where a command is written: the inline code spans, and the lines of the `sh` blocks
    without their comments (a `text` block is what a program printed)."""
    shell = re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)
    lines = [re.sub(r"(^|\s)#.*", "", line).strip() for block in shell for line in block.splitlines()]
    return re.findall(r"`([^`\n]+)`", without_fences(text)) + [line for line in lines if line]


def named_in_code(pattern: str) -> Iterator[tuple[str, str]]:
    """(page, first group) of each match of `pattern` in the pages' code."""
    for page in PAGES:
        for code in code_of(page_text(page)):
            for match in re.finditer(pattern, code):
                yield page, match.group(1)


def section(text: str, heading: str) -> str:
    """The section under the heading, up to the next heading of its level or above; '' if none."""
    lines = without_fences(text).splitlines()
    for start, line in enumerate(lines):
        match = re.fullmatch(r"(#+)\s+(.*?)\s*", line)
        if match and match.group(2) == heading:
            level, body = len(match.group(1)), []
            for later in lines[start + 1 :]:
                deeper = re.match(r"(#+)\s", later)
                if deeper and len(deeper.group(1)) <= level:
                    break
                body.append(later)
            return "\n".join(body)
    return ""


def table_rows(text: str) -> Iterator[list[str]]:
    """The cells of each table row, its header and rule lines left out."""
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[\s|:-]+\|", line.strip()):
            yield [cell.strip() for cell in line.strip().strip("|").split("|")]
