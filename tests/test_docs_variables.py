"""Every environment variable the code reads is documented where its kind is listed, and every
one the pages name is read.

- Each variable the production code reads (a `CLOCKQ_*` name, or a setting read through the
  helpers of clockq/env.py) is in a table of the section that lists its kind: an operator's
  setting in docs/operations.md's Settings, with its default and meaning; what the launcher sets
  for its children in the same page's "Set by the launcher"; a command program's environment in
  docs/workloads.md; the command line's in docs/cli.md. Which kind a name is, is written down
  here (`KINDS`), explicitly: every name not there is an operator's setting.
- Each `CLOCKQ_*` name the pages and the README give is read by the code, a benchmark or a
  deploy file, or is a Django setting; so is each other setting or constant they give in capitals
  (`CELERY_DB_REUSE_MAX`, `PREFETCH_WAIT_S`), or it is the code's or the tests' own, or the system's
  (`O_NOFOLLOW`). Each settings row's default is the code's, where the code gives it as a value.
"""

from __future__ import annotations

import ast
import errno
import os
import re
import resource
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from django.conf import settings

from tests.docs_pages import (
    PAGES,
    PRODUCTION,
    ROOT,
    called,
    named_in_code,
    page_text,
    parsed,
    python_files,
    section,
    strings_of_the_code,
    table_rows,
)

CLOCKQ_NAME = re.compile(r"CLOCKQ_[A-Z0-9_]*[A-Z0-9]")
# The helpers of clockq/env.py that read one variable, named by their first argument.
ENV_HELPERS = frozenset(
    {"env_str", "env_or_file", "env_bool", "env_choice", "env_int", "env_float", "env_list"}
    | {"env_int_list", "env_float_list"}
)


@dataclass(frozen=True)
class Kind:
    """A kind of variable, and the section whose tables list that kind (a heading, and what
    stands under it up to the next heading of its level or above)."""

    what: str
    page: str
    section: str


OPERATOR = Kind("an operator's setting", "docs/operations.md", "Settings")
LAUNCHER = Kind("set by the launcher for the processes it starts", "docs/operations.md", "Set by the launcher")
PROGRAM = Kind("a command program's environment", "docs/workloads.md", "A program's environment")
CLI = Kind("the command line's", "docs/cli.md", "Environment")

# Every name that is not an operator's setting, by kind. A name the code stops using must leave
# this table too (test_the_kinds_name_only_what_the_code_uses).
KINDS: dict[str, Kind] = {
    # The command workload gives these to the program; the worker's own CLOCKQ_* it withholds.
    **dict.fromkeys(
        ("CLOCKQ_CHECKPOINT_FILE", "CLOCKQ_PROGRESS_FILE", "CLOCKQ_JOB_ID", "CLOCKQ_WORK_DIR"),
        PROGRAM,
    ),
    **dict.fromkeys(("CLOCKQ_METRICS_FILE", "CLOCKQ_RESULT_DIR", "CLOCKQ_RESUME"), PROGRAM),
    # clockq_cli: the operator's machine, not the server's.
    **dict.fromkeys(("CLOCKQ_URL", "CLOCKQ_TOKEN", "CLOCKQ_MAX_PAGES"), CLI),
    # From a launcher (gpuworkers, runstack) to what it starts: the GPU a worker is pinned to,
    # an RT lane's names, the launcher's identity that holds the worker names.
    **dict.fromkeys(("CLOCKQ_GPU_INDEX", "CLOCKQ_GPU_SIMULATED", "CLOCKQ_GPU_MEMORY_MIB"), LAUNCHER),
    **dict.fromkeys(("CLOCKQ_RT_LANE_NAME", "CLOCKQ_RT_LANE_OF", "CLOCKQ_INSTANCE"), LAUNCHER),
}

# Names the pages give that are no variable of clockq's, each with where and why.
NOT_OURS = {
    # docs/deploy.md: what Kubernetes's service links would set for a Service named clockq-flower,
    # the reason every pod turns them off.
    "CLOCKQ_FLOWER_PORT",
    # SQL's window function, in docs/benchmarks.md.
    "ROW_NUMBER",
}
# Where the system's own constants are (`O_NOFOLLOW`, `RLIMIT_AS`, `SIGTERM`).
SYSTEM = (os, resource, signal, errno, stat)
CAPITALS = r"^([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)$"


def variables_read(tree: ast.AST) -> set[str]:
    """The environment variables a module names: every string that is a whole `CLOCKQ_*` name
    (a constant, a key, a default), every `CLOCKQ_*` keyword of a call (an environment built with
    `dict(CLOCKQ_X=...)` or `.update(...)`), the first argument of the clockq.env helpers, and the
    `_FILE` twin of each name read through `env_or_file`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CLOCKQ_NAME.fullmatch(node.value):
            names.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg and CLOCKQ_NAME.fullmatch(node.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Call) and called(node) in ENV_HELPERS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value)
                if called(node) == "env_or_file":
                    names.add(f"{first.value}_FILE")
    return names


@cache
def read_by_production() -> frozenset[str]:
    return frozenset(name for path in python_files(*PRODUCTION) for name in variables_read(parsed(path)))


@cache
def read_anywhere() -> frozenset[str]:
    """The production code's variables, those the benchmarks read (a token for the live replay)
    and those the deploy files use (`${CLOCKQ_IMAGE_TAG:-latest}`, compose/make-secrets.sh's)."""
    benches = {name for path in python_files("bench") for name in variables_read(parsed(path))}
    deploy_files = [p for p in (ROOT / "compose").rglob("*") if p.is_file()] + [ROOT / "Dockerfile"]
    deploys = {name for path in deploy_files for name in CLOCKQ_NAME.findall(path.read_text(errors="replace"))}
    return read_by_production() | benches | deploys


def kind_of(name: str) -> Kind:
    return KINDS.get(name, OPERATOR)


def listed_in(kind: Kind) -> dict[str, list[str]]:
    """Each variable the first column of the section's tables names, with its row's cells."""
    rows: dict[str, list[str]] = {}
    for cells in table_rows(section(page_text(kind.page), kind.section)):
        for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]):
            rows[name] = cells
    return rows


def names_in_pages() -> Iterator[tuple[str, str]]:
    """(page, name) of every CLOCKQ_* name the pages give; `CLOCKQ_ADMISSION_*` stands for the
    names it starts."""
    for page in PAGES:
        for match in re.finditer(r"CLOCKQ_[A-Z0-9_]*[A-Z0-9](_\*)?", page_text(page)):
            yield page, match.group(0)


def _named(name: str) -> bool:
    if name.endswith("_*"):
        return any(known.startswith(name[:-1]) for known in read_anywhere())
    return name in read_anywhere() or hasattr(settings, name) or name in NOT_OURS


@cache
def names_the_code_defines() -> frozenset[str]:
    """Every name a module of the code, the benchmarks or the tests binds, at its top or in a
    class, with a leading underscore dropped (`_PR_SET_PDEATHSIG`)."""
    names: set[str] = set()
    for path in python_files(*PRODUCTION, "bench", "tests"):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Assign):
                names |= {t.id.lstrip("_") for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id.lstrip("_"))
    return frozenset(names)


def _exists(name: str) -> bool:
    """A setting, a database's option (`CONN_MAX_AGE`), a name of the code's, a string it gives
    (a Redis key, a task's name) or the system's."""
    return (
        _named(name)
        or any(name in database for database in settings.DATABASES.values())
        or name in names_the_code_defines()
        or name in strings_of_the_code()
        or any(hasattr(module, name) for module in SYSTEM)
    )


def test_every_setting_or_constant_the_pages_name_exists():
    unknown = sorted({f"{page}: {name}" for page, name in named_in_code(CAPITALS) if not _exists(name)})
    assert not unknown, "settings or constants the pages name that nothing has:\n" + "\n".join(unknown)


def test_every_variable_the_code_reads_is_in_the_table_of_its_kind():
    missing = []
    for name in sorted(read_by_production()):
        kind = kind_of(name)
        if name not in listed_in(kind):
            missing.append(f"{name} ({kind.what}): not in the tables of {kind.page}, section {kind.section!r}")
    assert not missing, "variables read but not documented where their kind is:\n" + "\n".join(missing)


def test_every_variable_the_pages_name_is_read_by_the_code_or_is_a_setting():
    unknown = sorted({f"{page}: {name}" for page, name in names_in_pages() if not _named(name)})
    assert not unknown, "names the pages give that nothing reads:\n" + "\n".join(unknown)


def test_every_row_of_a_variables_table_is_a_variable_of_that_kind():
    wrong = []
    for kind in (OPERATOR, LAUNCHER, PROGRAM, CLI):
        assert listed_in(kind), f"{kind.page} has no table under {kind.section!r}"
        for name in listed_in(kind):
            if name not in read_by_production():
                wrong.append(f"{kind.page} ({kind.section}): {name} is read by nothing")
            elif kind_of(name) != kind:
                wrong.append(f"{kind.page} ({kind.section}): {name} is {kind_of(name).what}")
    assert not wrong, "\n".join(wrong)


def test_the_kinds_name_only_what_the_code_uses():
    stale = sorted(name for name in KINDS if name not in read_by_production())
    assert not stale, f"KINDS names variables the code no longer has: {stale}"


def defaults() -> Iterator[tuple[str, float | str]]:
    """(name, default) of each setting whose default the call gives as a value: a number or a
    choice, written there or as a constant of a module (`_control.CLOSE_ABOVE`)."""
    for path in python_files("clockq"):
        # `env_int(X, 0) if X is set else None`: the number is no default, unset is.
        when_set = {id(node.body) for node in ast.walk(parsed(path)) if isinstance(node, ast.IfExp)}
        for node in ast.walk(parsed(path)):
            if id(node) in when_set or not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name, default = node.args[0], node.args[1]
            if called(node) in {"env_int", "env_float", "env_choice"} and isinstance(name, ast.Constant):
                try:
                    yield str(name.value), value_of(default, parsed(path))
                except ValueError:
                    continue  # computed (a port found in var/): the prose says


def value_of(node: ast.expr, module: ast.Module) -> float | str:
    """A number or a string written as a literal, a product of literals (`20 * 1024`), or a
    name bound to one at the top of `module` or of the module it imports it from."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float | str)
        and not isinstance(node.value, bool)
    ):
        return float(node.value) if isinstance(node.value, int | float) else node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = value_of(node.left, module), value_of(node.right, module)
        if isinstance(left, float) and isinstance(right, float):
            return left * right
    if isinstance(node, ast.Name):
        return _bound(module, node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return _bound(_imported(module, node.value.id), node.attr)
    raise ValueError(ast.dump(node))


def _bound(module: ast.Module, name: str) -> float | str:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return value_of(node.value, module)
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            return _bound(_module_tree(f"{node.module}"), original)
    raise ValueError(name)


def _imported(module: ast.Module, alias: str) -> ast.Module:
    """The module that `from package import module as alias` or `import module as alias` binds."""
    for node in module.body:
        for a in getattr(node, "names", []) if isinstance(node, ast.Import | ast.ImportFrom) else []:
            if (a.asname or a.name) == alias:
                return _module_tree(f"{node.module}.{a.name}" if isinstance(node, ast.ImportFrom) else a.name)
    raise ValueError(alias)


def _module_tree(dotted: str) -> ast.Module:
    path = ROOT.joinpath(*dotted.split(".")).with_suffix(".py")
    if not path.is_file():
        raise ValueError(dotted)
    return parsed(path)


def test_each_settings_default_is_the_codes():
    rows, wrong = listed_in(OPERATOR), []
    for name, default in defaults():
        if name not in rows or len(rows[name]) < 2:
            continue  # test_every_variable_the_code_reads_is_in_the_table_of_its_kind names it
        cell = rows[name][1]
        if isinstance(default, str):
            right = default.lower() in {code.lower() for code in re.findall(r"`([^`]+)`", cell)}
        else:
            right = default in {float(n.replace(",", "")) for n in re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", cell)}
        if not right:
            wrong.append(f"{name}: the code's default is {default!r}, the table says {cell!r}")
    assert not wrong, "defaults the settings table gets wrong:\n" + "\n".join(wrong)


def test_what_counts_as_a_variable_read():
    source = (
        'A = "CLOCKQ_A"\nenv_int("CLOCKQ_B", 1)\nenv_or_file("SECRET")\nenv.update(CLOCKQ_C="1")\n'
        'log("CLOCKQ_D is wrong")\nx = f"{CLOCKQ_E}"\nenv_str("PLAIN")\n'
    )
    assert variables_read(ast.parse(source)) == {"CLOCKQ_A", "CLOCKQ_B", "SECRET", "SECRET_FILE", "CLOCKQ_C", "PLAIN"}


def test_a_section_ends_at_the_next_heading_of_its_level():
    text = "# Page\n## Settings\n| a | b |\n|---|---|\n| `X` | 1 |\n### Deeper\n| `Y` | 2 |\n## Next\n| `Z` | 3 |\n"
    assert [cells[0] for cells in table_rows(section(text, "Settings"))] == ["a", "`X`", "`Y`"]


def test_a_default_is_read_from_a_literal_a_product_or_a_constant_and_never_guessed():
    module = ast.parse('from clockq.policy import control as _control\nBASE = 2\nEND = "x"\n')
    calls = ["20 * 1024", "BASE * 3", "END", "_control.CLOSE_ABOVE", "port(VAR)", "UNBOUND"]
    values = []
    for call in calls:
        try:
            values.append(value_of(ast.parse(call, mode="eval").body, module))
        except ValueError:
            values.append(None)
    assert values == [20480.0, 6.0, "x", 0.85, None, None]
