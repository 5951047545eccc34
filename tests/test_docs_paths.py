"""No comment, docstring or page cites a file that doesn't exist.

A citation is a relative path whose first part is a top-level folder of the repository:
`clockq/policy/slicing.py`, `docs/api.md`, `bench/replay_kpis.sh`, a folder such as
`workers/workloads/`, or a glob such as `tests/webapp/test_*.py`. They are read from the
comments and docstrings of every Python file (migrations aside), from every Markdown file, and
from the comment lines of the Makefile, CI, shell scripts and config files; each must name a
file or folder the repository has. URLs, absolute paths (under /tmp, /run, /dev, ...), paths in
the home folder or under `../` and paths into untracked folders (`var/`, `.venv/`) are not
citations of the repository and are not checked.

The repository is what git lists, tracked or not yet added (but not ignored), so a file moved in
the work tree counts at its new place before it is committed, and a file that exists only
because something ignored left it there does not count at all.
"""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A run of path characters with at least one slash. It may not start right after a character
# that would make it part of something longer: a URL or absolute path (`/`), `../` or `./..`
# (`.`), the home folder (`~`), a variable (`$`), a placeholder (`<job>/`), a Python attribute
# or a word (`\w`, `-`).
CANDIDATE = re.compile(r"(?<![\w./~:@$<>{}\\-])(?:\./)?([A-Za-z0-9_][A-Za-z0-9_.-]*(?:(?:/[A-Za-z0-9_.*-]+)+/?|/))")
CONFIG_COMMENTS = ("Makefile", ".ci/run", "*.sh", "*.toml", "*.yml", "*.yaml", "*.cfg", "*.ini", "*.txt")


@cache
def repo_paths() -> tuple[frozenset[str], frozenset[str]]:
    """Files and folders of the repository, as paths relative to its root."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git work tree: {exc}")
    files = {name for name in out.decode().split("\0") if name and (ROOT / name).is_file()}
    folders = {str(parent) for name in files for parent in Path(name).parents if str(parent) != "."}
    return frozenset(files), frozenset(folders)


def top_level_folders() -> frozenset[str]:
    _, folders = repo_paths()
    return frozenset(folder for folder in folders if "/" not in folder)


def citations(text: str) -> Iterator[tuple[int, str]]:
    """(line offset, path) of each citation of the repository in the text."""
    tops = top_level_folders()
    for offset, line in enumerate(text.splitlines()):
        for match in CANDIDATE.finditer(line):
            path = match.group(1).rstrip(".,;:")
            if path.split("/", 1)[0] in tops:
                yield offset, path


def exists(path: str) -> bool:
    files, folders = repo_paths()
    if "*" in path:
        return any(fnmatch.fnmatchcase(candidate, path.rstrip("/")) for candidate in files | folders)
    if path.endswith("/"):
        return path.rstrip("/") in folders
    return path in files or path in folders


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of every comment and docstring of a Python file."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                value = body[0].value
                if isinstance(value.value, str):
                    yield value.lineno, value.value


def config_comments(source: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(source.splitlines(), 1):
        if line.lstrip().startswith("#"):
            yield number, line


def prose_of(name: str) -> Iterator[tuple[int, str]]:
    source = (ROOT / name).read_text(encoding="utf-8")
    if name.endswith(".py"):
        yield from python_prose(source)
    elif name.endswith(".md"):
        yield 1, source
    else:
        yield from config_comments(source)


def scanned_files() -> list[str]:
    files, _ = repo_paths()
    picked = []
    for name in sorted(files):
        base = name.rsplit("/", 1)[-1]
        if name.endswith(".py"):
            if "/migrations/" not in f"/{name}":
                picked.append(name)
        elif name.endswith(".md") or any(fnmatch.fnmatchcase(name, p) or base == p for p in CONFIG_COMMENTS):
            picked.append(name)
    return picked


def missing_citations() -> list[str]:
    missing = []
    for name in scanned_files():
        for first_line, text in prose_of(name):
            for offset, path in citations(text):
                if not exists(path):
                    missing.append(f"{name}:{first_line + offset}: {path}")
    return missing


def test_every_cited_path_exists():
    missing = missing_citations()
    assert not missing, "paths cited that the repository does not have:\n" + "\n".join(missing)


def test_the_scan_covers_code_docs_and_config():
    names = scanned_files()
    assert "README.md" in names
    assert any(name.startswith("docs/") for name in names)
    assert "tests/test_docs_paths.py" in names
    assert "Makefile" in names
    assert not any("/migrations/" in name for name in names)


def test_what_counts_as_a_citation():
    real = "tests/test_docs_paths.py"
    gone = "tests/" + "no_such_file.py"  # built here, so that this file cites nothing missing
    text = "\n".join(
        [
            f"see {real}, and {gone}.",
            "a folder: tests/ and ./docs/ and a glob tests/test_*.py",
            "not ours: http://localhost:8000/tests/x.py /tmp/tests/x.py ~/tests/x ../tests/x.py",
            "$HOME/tests/x <job>/tests/x var/clockq.sqlite3 .venv/bin/python jobs/s pub/sub",
            "a module attribute: clockq.tests/x",
        ]
    )
    found = [path for _, path in citations(text)]
    assert found == [real, gone, "tests/", "docs/", "tests/test_*.py"]
    assert [exists(path) for path in found] == [True, False, True, True, True]


def test_comments_and_docstrings_are_read_not_code():
    source = '"""Module: tests/a.py."""\nX = "tests/code.py"  # comment: tests/b.py\n\ndef f():\n    """tests/c.py"""\n'
    assert sorted(path for line, text in python_prose(source) for _, path in citations(text)) == [
        "tests/a.py",
        "tests/b.py",
        "tests/c.py",
    ]
