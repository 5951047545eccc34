"""What a tier is lives in one place, clockq/policy/tiers.py (`TIERS`): no other production module
writes a tier's identity down as a constant. What counts, read from each module's syntax tree:

- a string literal that is a tier code ("RT", "HP", ...): name the tier as `tiers.RT.code`, or
  ask what it is (`TierSpec.interrupts`, `.best_effort`, `.always_admitted`, `.realtime`);
- a comparison of a rank with an integer literal (`rank == 0`, `rank < 2`), or a rank number
  kept as a constant (`INTERRUPT_BELOW_RANK = 2`): a rank's meaning is its tier's flags, not its
  number;
- a tier found by its place: `TIERS[0]`, `QUEUES_IN_ORDER[:1]`, `TIER_CODES[2]`.

Migrations are history and keep the codes they were written with; tests may name tiers freely.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from clockq.policy.tiers import TIER_CODES
from tests.harness import ROOT

PACKAGES = ("clockq", "workers", "webapp", "control", "predictor", "clockq_cli")
DEFINITION = "clockq/policy/tiers.py"
BY_PLACE = {"TIERS", "QUEUES_IN_ORDER", "TIER_CODES"}
# Modules that may still write a tier down, each with why.
ALLOWED = {
    # The CLI speaks HTTP only (an import contract): it cannot import the definition, and the
    # server refuses a code that is not a tier's, naming the ones there are.
    "clockq_cli/cmd_jobs.py": "the CLI cannot import the server's packages",
}


def _is_int_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _names_a_rank(node: ast.AST) -> bool:
    """`rank`, `to_rank`, `job.rank`; not a number per rank (`weight_per_rank`)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("rank") and "per_rank" not in name.lower()


def _a_rank_constant(target: ast.AST) -> bool:
    """A module's constant (`RT_RANK`), not a variable's first value (`self._head_rank = 0`)."""
    return isinstance(target, ast.Name) and target.id.isupper() and _names_a_rank(target)


def _by_place(node: ast.Subscript) -> bool:
    name = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", "")
    if name not in BY_PLACE:
        return False
    index = node.slice
    if isinstance(index, ast.Slice):
        return any(_is_int_literal(part) for part in (index.lower, index.upper) if part is not None)
    return _is_int_literal(index)


def tier_constants(source: str, filename: str = "<module>") -> list[str]:
    """Every place in `source` that writes a tier down as a constant, as 'line: what'."""
    tree = ast.parse(source, filename=filename)
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in TIER_CODES and id(node) not in in_fstrings:
            found.append(f"{node.lineno}: the tier code {node.value!r} as a literal")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_a_rank(o) for o in operands) and any(_is_int_literal(o) for o in operands):
                found.append(f"{node.lineno}: a rank compared with a number ({ast.unparse(node)})")
        elif isinstance(node, ast.Assign) and _is_int_literal(node.value) and any(map(_a_rank_constant, node.targets)):
            found.append(f"{node.lineno}: a rank number as a constant ({ast.unparse(node)})")
        elif isinstance(node, ast.Subscript) and _by_place(node):
            found.append(f"{node.lineno}: a tier found by its place ({ast.unparse(node)})")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def _production_modules() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts and ".venv" not in path.parts
    )


def test_no_production_module_writes_a_rank_or_a_tier_code_as_a_constant():
    offences = {}
    for path in _production_modules():
        relative = path.relative_to(ROOT).as_posix()
        if relative == DEFINITION or relative in ALLOWED:
            continue
        if found := tier_constants(path.read_text(), relative):
            offences[relative] = found
    assert offences == {}, "write the tier as clockq/policy/tiers.py names it (module docstring)"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('if tier_code in {"RT"}:\n    pass\n', ["1: the tier code 'RT' as a literal"]),
        ("ok = running.rank == 0\n", ["1: a rank compared with a number (running.rank == 0)"]),
        ("ok = self.weight_per_rank >= 1\n", []),
        ("SHARE_FROM_RANK = 3\n", ["1: a rank number as a constant (SHARE_FROM_RANK = 3)"]),
        ("urgent = rank < INTERRUPT_BELOW_RANK or my_rank >= 3\n", ["1: a rank compared with a number (my_rank >= 3)"]),
        ("rt = QUEUES_IN_ORDER[:1]\nhp = tiers.TIERS[1]\n", [
            "1: a tier found by its place (QUEUES_IN_ORDER[:1])",
            "2: a tier found by its place (tiers.TIERS[1])",
        ]),
        # Not a tier: a worker's name in an f-string, a code as the definition names it, a count.
        ('name = f"rt{i}@host"\ntier = RT.code\nif len(ranks) == 5:\n    pass\n', []),
    ],
)  # fmt: skip
def test_the_scan_finds_each_kind_of_constant_and_nothing_else(source, found):
    assert tier_constants(source) == found


def test_the_modules_it_allows_still_need_it():
    for relative in ALLOWED:
        path = ROOT / relative
        assert path.exists() and tier_constants(path.read_text(), relative), f"{relative} may leave ALLOWED"
