"""A tier's rank in the database's terms. The QueueTier rows hold only what an operator tunes;
which tier outranks which is the definition's (clockq/policy/tiers.py), so queries that sort or
group by rank compute it from the tier's code, with the rank of each code written out from TIERS."""

from __future__ import annotations

from django.db.models import Case, IntegerField, Value, When

from clockq.policy.tiers import TIERS


def tier_rank(code_field: str = "code") -> Case:
    """The rank of the tier whose code is `code_field` (e.g. "tier__code" from a job), for
    order_by and annotate; a code no tier has sorts after every tier."""
    return Case(
        *(When(**{code_field: t.code}, then=Value(t.rank)) for t in TIERS),
        default=Value(len(TIERS)),
        output_field=IntegerField(),
    )


def rank_sql(code_column: str) -> str:
    """The same as SQL, for the hand-written queries (clockq/jobs/order.py): `code_column` is a
    qualified column such as "t.code". The codes are TIERS' own, never user input."""
    whens = " ".join(f"WHEN '{t.code}' THEN {t.rank}" for t in TIERS)
    return f"(CASE {code_column} {whens} ELSE {len(TIERS)} END)"
