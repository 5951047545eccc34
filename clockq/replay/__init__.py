"""Trace replay: a discrete-event simulator that runs the live scheduling policy
(clockq/policy) and three published baselines on real job traces. Pure Python: no Django,
Celery or Redis, so it runs anywhere and fast."""
