"""The QueueTier rows, seeded from the one definition of the tiers (clockq/policy/tiers.py), and
the system check that they still agree with it. The seeding is used by the data migrations and
by tests."""

from __future__ import annotations

from django.core import checks
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from clockq.policy.tiers import TIERS, row_problems


def ensure_default_tiers(tier_model) -> None:
    """Create any missing tier row, with the specification's service levels and promotion links.
    Existing rows keep an operator's edits. Migrations pass their historical model, which may
    predate some fields: only the fields it has are set (0006 sets the later ones)."""
    has = {f.name for f in tier_model._meta.get_fields()}
    created = set()
    for spec in TIERS:
        _, made = tier_model.objects.get_or_create(
            code=spec.code,
            defaults={
                name: value
                for name, value in {
                    "rank": spec.rank,  # the historical models of 0001..0025 still have it
                    "use": spec.use,
                    "queue_name": spec.queue_name,  # likewise
                    "wait_target_ms": spec.wait_target_ms,
                    "base_slice_ms": spec.base_slice_ms,
                    "min_slice_ms": spec.min_slice_ms,
                    "start_timeout_ms": spec.start_timeout_ms,
                    "promote_after_rounds": spec.promote_after_rounds,
                    "chance_jobs": spec.chance_jobs,
                }.items()
                if name in has
            },
        )
        if made:
            created.add(spec.code)
    if "promote_to" in has:
        link_default_tiers(tier_model, only=created)


def link_default_tiers(tier_model, only=None) -> None:
    """Point the promotion and batch-chance links as the specification has them, for the tiers
    in `only` (all when None). A second pass: a link needs its target's row."""
    rows = {t.code: t for t in tier_model.objects.all()}
    for spec in TIERS:
        if spec.code not in rows or (only is not None and spec.code not in only):
            continue
        tier_model.objects.filter(pk=rows[spec.code].pk).update(
            promote_to=rows.get(spec.promote_to) if spec.promote_to else None,
            chance_to=rows.get(spec.chance_to) if spec.chance_to else None,
        )


def check_tier_rows(app_configs=None, databases=None, **kwargs) -> list[checks.CheckMessage]:
    """The tier rows of each database asked for agree with the definition: one row per tier and
    none for a code it does not define. A database still to be migrated is left alone: its migrations seed them."""
    from clockq.jobs.models import QueueTier

    errors: list[checks.CheckMessage] = []
    for alias in databases or ():
        executor = MigrationExecutor(connections[alias])
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            continue
        rows = QueueTier.objects.using(alias).values_list("code", flat=True)
        errors += [
            checks.Error(
                f"QueueTier rows in database {alias!r} disagree with clockq/policy/tiers.py: {problem}",
                hint="The tiers that exist are defined in clockq/policy/tiers.py (TIERS); a change there "
                "needs a data migration that changes the rows to match.",
                obj=QueueTier,
                id="clockq.E002",
            )
            for problem in row_problems(rows)
        ]
    return errors
