"""Seed the five tiers from the policy's table; used by the data migration and by tests."""

from __future__ import annotations

from clockq.policy.tiers import DEFAULT_TIERS


def ensure_default_tiers(tier_model) -> None:
    """Create any missing tier row. Existing rows keep an operator's edits."""
    for spec in DEFAULT_TIERS:
        tier_model.objects.get_or_create(
            code=spec.code,
            defaults={
                "rank": spec.rank,
                "use": spec.use,
                "queue_name": spec.queue_name,
                "wait_target_ms": spec.wait_target_ms,
                "base_slice_ms": spec.base_slice_ms,
                "min_slice_ms": spec.min_slice_ms,
            },
        )
