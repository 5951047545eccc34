"""Failed-login counts in a process's memory, bounded, that a flood cannot flush: Flower's lockout
(clockq/flower.py; the web's is django-axes', in the database).

The first version kept one table of (username, address) and, once it held 10,000 keys, dropped
every key not yet locked: 4 wrong admin passwords, then 10,001 made-up usernames, then 4 more,
again and again, never met a 429. Now three counts are kept apart:

- per (username, source) for the usernames Flower has: `limit` failures in a row lock that pair;
- the same for names it has not, which can never log in (counted so that their answers look the
  same): a flood of made-up names fills this table only, so it cannot push a real name's count out;
- per (username, kind of source) for the names Flower has: `username_limit` failures lock that
  username for that kind (another machine, this host, a job on this host), which stops a guesser
  who spreads over many addresses or many jobs. Failures from jobs lock only jobs out: whatever a
  job does, the admin on the host or elsewhere still gets in.

A lock lasts `window_s` from the last failure; a failure more than `window_s` after the one
before starts the count again; a success clears its (username, source) count, not the username's.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass

from clockq.login_source import LoginSource

MAX_KEYS = 10_000  # per table: a guesser cycling names or addresses cannot grow one without bound


@dataclass
class _Failures:
    count: int
    last_at: float


class FailureCounts:
    """Failures per key, at most `max_keys` of them. `limit` failures in a row, each within
    `window_s` of the one before, lock the key until `window_s` after the last. When the table is
    full a new key pushes out the key that failed longest ago among those not locked, one at a
    time; only when every key is locked does the lock nearest its end go first."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float], max_keys: int = MAX_KEYS):
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self.max_keys = max_keys
        # Both in the order of their last failure, oldest first (a move_to_end at each failure).
        self._counting: OrderedDict[Hashable, _Failures] = OrderedDict()
        self._locked: OrderedDict[Hashable, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counting) + len(self._locked)

    def locked_for_s(self, key: Hashable) -> float:
        """Seconds until `key` may try again; 0 when it may now."""
        failures = self._locked.get(key)
        if failures is None:
            return 0.0
        left = failures.last_at + self.window_s - self.clock()
        if left <= 0:
            del self._locked[key]  # counting starts again from none
            return 0.0
        return left

    def failed(self, key: Hashable) -> None:
        now = self.clock()
        failures = self._locked.pop(key, None) or self._counting.pop(key, None)
        if failures is None or now - failures.last_at >= self.window_s:
            self._make_room(now)
            failures = _Failures(0, now)
        failures.count += 1
        failures.last_at = now
        (self._locked if failures.count >= self.limit else self._counting)[key] = failures

    def forget(self, key: Hashable) -> None:
        self._counting.pop(key, None)
        self._locked.pop(key, None)

    def _make_room(self, now: float) -> None:
        while self._locked and now - next(iter(self._locked.values())).last_at >= self.window_s:
            self._locked.popitem(last=False)  # expired: nearest their end first
        if len(self) < self.max_keys:
            return
        (self._counting or self._locked).popitem(last=False)


class LockScope(enum.Enum):
    """What a refused login is locked by."""

    SOURCE = "this user from this address"
    USERNAME = "this user"


@dataclass(frozen=True)
class Refusal:
    scope: LockScope
    retry_after_s: float


class LoginLockout:
    """Flower's three counts (see the module's docstring) for the logins `usernames`."""

    def __init__(
        self,
        usernames: Collection[str],
        limit: int,
        username_limit: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_KEYS,
    ):
        self.usernames = frozenset(usernames)
        self.known_sources = FailureCounts(limit, window_s, clock, max_keys)
        self.unknown_sources = FailureCounts(limit, window_s, clock, max_keys)
        # At most (Flower's logins times the three kinds of source) keys: never full.
        self.per_username = FailureCounts(username_limit, window_s, clock)

    def refusal(self, username: str, source: LoginSource) -> Refusal | None:
        """Why a login of `username` from `source` is refused whatever its password; None if it is not."""
        left = self._sources(username).locked_for_s((username, source.lockout_address))
        if left:
            return Refusal(LockScope.SOURCE, left)
        if username in self.usernames and (left := self.per_username.locked_for_s((username, source.kind))):
            return Refusal(LockScope.USERNAME, left)
        return None

    def failed(self, username: str, source: LoginSource) -> None:
        self._sources(username).failed((username, source.lockout_address))
        if username in self.usernames:
            self.per_username.failed((username, source.kind))

    def succeeded(self, username: str, source: LoginSource) -> None:
        self._sources(username).forget((username, source.lockout_address))

    def _sources(self, username: str) -> FailureCounts:
        return self.known_sources if username in self.usernames else self.unknown_sources
