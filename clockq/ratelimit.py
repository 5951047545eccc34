"""Warnings that repeat (a GPU off the bus, a dead broker) logged at most once a minute each."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LOG_EVERY_S = 60.0


class RateLimitedWarnings:
    """Log each distinct text at WARNING at most once per `every_s`."""

    MAX_TEXTS = 256

    def __init__(
        self, logger: logging.Logger, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ):
        self.logger = logger
        self.every_s = every_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def warn(self, text: str) -> bool:
        """Log `text` unless it was logged less than `every_s` ago. True if it was logged."""
        now = self.clock()
        with self._lock:
            last = self._last.get(text)
            if last is not None and now - last < self.every_s:
                return False
            if len(self._last) >= self.MAX_TEXTS:
                self._last = {t: at for t, at in self._last.items() if now - at < self.every_s}
            self._last[text] = now
        self.logger.warning("%s", text)
        return True
