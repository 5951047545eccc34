"""Every command, endpoint and module the pages and the README name exists.

- Every `make` target, `manage.py` command and `clockq` subcommand written in their code (inline
  spans and `sh` blocks) exists, and the architecture page lists every command of
  `clockq/management/`.
- Every endpoint they give (`GET /api/jobs/<id>`, http://localhost:8000/jobs/new) is a route of
  the server, and every periodic task they name (`clockq: SLO check`) is one the code seeds.
- Every module, and name in it, given as `clockq.jobs.transitions.transition` or as
  `clockq/policy/lanes.py::rt_lane_path` exists, or is a name the code itself gives (a Celery
  task's, a logger's, a system check's); a name given by its module's last part
  (`ordering.pick_next`) is in a module of that name, and a module given alone (`lanes.py`) is
  one the repository has; every module a row of the architecture page's package table names is
  in that package, and the `clockq/bus/` row names every module of the bus.

Paths cited as paths (`clockq/jobs/transitions.py`) are tests/test_docs_paths.py's.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Container, Iterator
from pathlib import Path

import pytest
from django.core.management import get_commands
from django.urls import Resolver404, resolve

from tests.docs_pages import (
    PAGES,
    PRODUCTION,
    ROOT,
    named_in_code,
    page_text,
    parsed,
    strings_of_the_code,
    table_rows,
)

MAKE = r"(?:^|[\s;&|(])make\s+([a-z][\w-]*)"
MANAGE = r"manage\.py\s+([a-z]\w*)"
# The command first on its line, after a prompt or a pipe, or as a path's last part:
# `celery -A clockq worker` names the Celery app, `kubectl -n clockq get` a namespace.
CLOCKQ = r"(?:^|\$ |[;&|]\s*|/)clockq\s+([a-z][\w-]*)"
# A file's name (`clockq.json`, Grafana's dashboard) is no module.
DOTTED = rf"^((?:{'|'.join(PRODUCTION)})(?:\.[A-Za-z_]\w*)+)(?<!\.json)(?<!\.yaml)(?:\(\))?$"
CITED = r"^([\w/]+\.py::[\w.]+)(?:\(\))?$"
SHORT = r"^([a-z_][a-z0-9_]*\.[A-Za-z_][\w.]*?)(?:\(\))?$"
BARE_MODULE = r"^(\w+)\.py$"
# What ends a file's name (`model.keras`, `state.bin`), which is no module's name.
FILE_ENDINGS = {"py", "bin", "keras", "npy", "json", "jsonl", "yaml", "yml", "csv", "txt", "log", "md", "sh", "ckpt"}
ENDPOINT = r"^(?:GET|POST|PUT|PATCH|DELETE) (/[^\s?]*)"
LOCAL_URL = r"http://localhost:8000(/[\w/<>.-]*)"
PERIODIC = r"^(clockq: [A-Za-z][\w ]*\w)$"
# A row of the architecture page's package table that lists its package's modules in full; the
# others name some of them.
COMPLETE_ROWS = {"clockq/bus/"}


def make_targets() -> set[str]:
    rules = re.finditer(r"^([A-Za-z0-9_. -]+):(?!=)", page_text("Makefile"), flags=re.M)
    return {target for rule in rules for target in rule.group(1).split()}


def unknown(pattern: str, known: Container[str], shown: str) -> list[str]:
    return sorted({f"{page}: {shown} {name}" for page, name in named_in_code(pattern) if name not in known})


def test_every_make_target_the_pages_name_exists():
    missing = unknown(MAKE, make_targets(), "make")
    assert not missing, "make targets the Makefile does not have:\n" + "\n".join(missing)


def test_every_manage_py_command_the_pages_name_exists():
    missing = unknown(MANAGE, get_commands(), "manage.py")
    assert not missing, "manage.py commands that do not exist:\n" + "\n".join(missing)


def test_every_clockq_subcommand_the_pages_name_exists():
    from clockq_cli.main import cli

    missing = unknown(CLOCKQ, cli.commands, "clockq")
    assert not missing, "clockq subcommands that do not exist:\n" + "\n".join(missing)


def test_the_architecture_page_lists_every_command_of_the_core():
    line = next(line for line in page_text("docs/architecture.md").splitlines() if "(`clockq/management/`)" in line)
    listed = set(re.findall(r"`(\w+)`", line.split("(`clockq/management/`)", 1)[1]))
    there = {p.stem for p in (ROOT / "clockq/management/commands").glob("*.py") if p.stem != "__init__"}
    assert listed == there, f"docs/architecture.md lists {sorted(listed)}; clockq/management/commands: {sorted(there)}"


def route_of(path: str) -> str | None:
    """The route's name a path resolves to (`<id>` read as 1, other placeholders as words), or
    None when only the catch-all JSON 404 of /api/, which has no name, takes it."""
    concrete = re.sub(r"<[^>]*>", "x", path.replace("<id>", "1"))
    try:
        match = resolve(concrete)
    except Resolver404:
        return None
    return match.url_name


def test_every_endpoint_the_pages_give_is_a_route():
    urls = {(page, m.group(1)) for page in PAGES for m in re.finditer(LOCAL_URL, page_text(page))}
    given = set(named_in_code(ENDPOINT)) | urls
    missing = sorted({f"{page}: {path}" for page, path in given if route_of(path) is None})
    assert not missing, "endpoints the server does not have:\n" + "\n".join(missing)


def test_every_periodic_task_the_pages_name_is_one_the_code_seeds():
    missing = sorted({f"{page}: {name}" for page, name in named_in_code(PERIODIC) if name not in strings_of_the_code()})
    assert not missing, "periodic tasks the code does not have:\n" + "\n".join(missing)


def module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defines(path: Path, dotted_name: str) -> bool:
    """Whether the module defines the name (`Class.attribute` looks into the class)."""
    body: list[ast.stmt] = parsed(path).body
    for part in dotted_name.split("."):
        found = next((node for node in _statements(body) if _binds(node, part)), None)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _statements(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])


def _binds(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names)
    return False


def dotted_exists(dotted: str) -> bool:
    """Whether the longest module the name starts with exists and defines the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]))
        if path is not None:
            return cut == len(parts) or defines(path, ".".join(parts[cut:]))
    return False


def cited_exists(cited: str) -> bool:
    path, name = cited.split("::")
    return (ROOT / path).is_file() and defines(ROOT / path, name)


def test_every_module_and_name_the_pages_give_exists():
    # A dotted name the code gives itself is a Celery task's, a logger's or a system check's
    # (`clockq.batch_chance`, `clockq.slo`, `clockq.E001`), not a module.
    given = strings_of_the_code()
    wrong = sorted(
        {f"{page}: {name}" for page, name in named_in_code(DOTTED) if name not in given and not dotted_exists(name)}
        | {f"{page}: {name}" for page, name in named_in_code(CITED) if not cited_exists(name)}
    )
    assert not wrong, "modules or names the pages give that the code does not have:\n" + "\n".join(wrong)


def modules_by_last_part() -> dict[str, list[Path]]:
    modules: dict[str, list[Path]] = {}
    for folder in (*PRODUCTION, "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            modules.setdefault(path.stem, []).append(path)
    for path in ROOT.glob("*.py"):
        modules.setdefault(path.stem, []).append(path)
    return modules


def test_every_name_given_by_its_modules_last_part_is_in_such_a_module():
    modules, wrong = modules_by_last_part(), set()
    for page, given in named_in_code(SHORT):
        module, name = given.split(".", 1)
        if module in PRODUCTION or module not in modules or name in FILE_ENDINGS:
            continue  # a dotted name from the root (above), or a file's name
        if not any(defines(path, name) for path in modules[module]):
            wrong.add(f"{page}: {given}")
    wrong |= {f"{page}: {name}.py" for page, name in named_in_code(BARE_MODULE) if name not in modules}
    assert not wrong, "names no module of that name defines:\n" + "\n".join(sorted(wrong))


def package_rows() -> Iterator[tuple[str, str]]:
    """(package folder, the rest of its row) of the architecture page's package table."""
    for cells in table_rows(page_text("docs/architecture.md")):
        match = re.fullmatch(r"`((?:clockq/)?\w+/)`", cells[0])
        if match and (ROOT / match.group(1)).is_dir() and len(cells) > 1:
            yield match.group(1), " | ".join(cells[1:])


def test_the_package_table_names_modules_that_exist_and_the_bus_row_names_all():
    wrong = []
    for folder, row in package_rows():
        named = set(re.findall(r"`(\w+)\.py`", row))
        there = {p.stem for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"}
        wrong += [f"{folder}: {name}.py is not there" for name in sorted(named - there)]
        if folder in COMPLETE_ROWS:
            wrong += [f"{folder}: {name}.py is not in its row" for name in sorted(there - named)]
    assert not wrong, "docs/architecture.md's package table:\n" + "\n".join(wrong)


def test_the_package_table_names_every_package():
    table = "\n".join(" | ".join(cells) for cells in table_rows(page_text("docs/architecture.md")))
    packages = [
        str(init.parent.relative_to(ROOT))
        for folder in PRODUCTION
        for init in sorted((ROOT / folder).glob("**/__init__.py"))
        if init.parent.parent in (ROOT, ROOT / "clockq") and "migrations" not in init.parts
    ]
    missing = [package for package in packages if f"`{package}/`" not in table]
    assert not missing, f"docs/architecture.md's package table does not name {missing}"


def test_a_name_resolves_to_a_module_and_into_its_classes():
    assert dotted_exists("clockq.jobs.transitions.transition")
    assert dotted_exists("tests.docs_pages.ROOT")
    assert not dotted_exists("clockq.jobs.transitions.transition.inside")
    assert not dotted_exists("clockq.jobs.no_such_module")
    assert not dotted_exists("clockq.jobs.transitions.no_such_name")


def test_a_path_the_catch_all_takes_is_no_route():
    assert route_of("/api/jobs/<id>/result/<name>") == "api-job-result-file"
    assert route_of("/api/no_such_endpoint") is None


@pytest.mark.parametrize(
    ("pattern", "code", "found"),
    [
        (MAKE, "make run", ["run"]),
        (MAKE, "PORT=8001 FLOWER_PORT=5556 make run", ["run"]),
        (MAKE, "a job may make way", ["way"]),  # why only code is read
        (CLOCKQ, "clockq login https://clockq.example.org", ["login"]),
        (CLOCKQ, "~/clockq-cli/bin/clockq submit job.yaml", ["submit"]),
        (CLOCKQ, "celery -A clockq worker -Q rt", []),
        (CLOCKQ, "kubectl -n clockq get pods", []),
        (DOTTED, "clockq.policy.control.admits", ["clockq.policy.control.admits"]),
        (DOTTED, "clockq.json", []),
        (ENDPOINT, "GET /api/jobs/<id>?history=1", ["/api/jobs/<id>"]),
        (SHORT, "ordering.pick_next", ["ordering.pick_next"]),
        (SHORT, "Job.switch_cost_ms", []),
        (PERIODIC, "clockq: SLO check", ["clockq: SLO check"]),
    ],
)
def test_what_the_patterns_read_in_code(pattern, code, found):
    assert [m.group(1) for m in re.finditer(pattern, code)] == found
