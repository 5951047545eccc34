"""Repeated warnings are logged at most once a minute per distinct text."""

from __future__ import annotations

import logging

from clockq.ratelimit import RateLimitedWarnings


def test_warnings_are_rate_limited_per_text(log_records):
    logger = logging.getLogger("test.ratelimit")
    logger.addHandler(log_records)
    now = [100.0]
    limiter = RateLimitedWarnings(logger, every_s=60.0, clock=lambda: now[0])
    try:
        assert limiter.warn("GPU lost") and not limiter.warn("GPU lost")
        assert limiter.warn("other text")
        now[0] += 59.0
        assert not limiter.warn("GPU lost")
        now[0] += 2.0
        assert limiter.warn("GPU lost")
    finally:
        logger.removeHandler(log_records)
    assert log_records.warnings == ["GPU lost", "other text", "GPU lost"]
