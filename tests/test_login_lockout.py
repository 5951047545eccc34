"""Flower's failed-login counts (clockq/login_lockout.py), with a fake clock: they lock, they end,
and neither a flood of made-up usernames nor failures from jobs unlock or lock the wrong login."""

from __future__ import annotations

from clockq.login_lockout import FailureCounts, LockScope, LoginLockout
from clockq.login_source import LoginSource, SourceKind


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


HOST = LoginSource("127.0.0.1", SourceKind.HOST, 0)
ELSEWHERE = LoginSource("10.0.0.7", SourceKind.REMOTE)
JOB = LoginSource("127.0.0.1", SourceKind.JOB, 1_000_000_005)


def remote(i: int) -> LoginSource:
    return LoginSource(f"10.1.{i // 256}.{i % 256}", SourceKind.REMOTE)


def job(i: int) -> LoginSource:
    return LoginSource("127.0.0.1", SourceKind.JOB, 1_000_000_000 + i)


def lockout(clock: Clock | None = None, **kwargs) -> LoginLockout:
    params = {"usernames": ["admin", "carol"], "limit": 5, "username_limit": 20, "window_s": 900} | kwargs
    return LoginLockout(clock=clock or Clock(), **params)


# --- one table -------------------------------------------------------------------------------


def test_five_failures_in_a_row_lock_the_key_for_the_window_then_it_may_try_again():
    clock = Clock()
    counts = FailureCounts(limit=5, window_s=900, clock=clock)
    for _ in range(4):
        counts.failed("carol")
    assert counts.locked_for_s("carol") == 0
    counts.failed("carol")
    assert counts.locked_for_s("carol") == 900
    clock.now += 899
    assert counts.locked_for_s("carol") == 1
    clock.now += 1
    assert counts.locked_for_s("carol") == 0
    counts.failed("carol")  # counting starts again from none
    assert counts.locked_for_s("carol") == 0


def test_a_failure_after_a_quiet_window_starts_the_count_again():
    clock = Clock()
    counts = FailureCounts(limit=2, window_s=60, clock=clock)
    counts.failed("carol")
    clock.now += 60
    counts.failed("carol")
    assert counts.locked_for_s("carol") == 0


def test_a_full_table_pushes_out_the_key_that_failed_longest_ago_one_at_a_time():
    clock = Clock()
    counts = FailureCounts(limit=2, window_s=60, clock=clock, max_keys=3)
    for key in ("alice", "bob", "carol"):
        counts.failed(key)
        clock.now += 1
    counts.failed("alice")  # alice failed last now, and is locked
    counts.failed("dave")  # pushes out bob alone
    assert len(counts) == 3
    counts.failed("carol")
    assert counts.locked_for_s("carol") > 0 and counts.locked_for_s("alice") > 0
    counts.failed("bob")
    assert counts.locked_for_s("bob") == 0  # bob's first failure was forgotten


def test_a_table_full_of_locks_forgets_the_lock_nearest_its_end_first():
    clock = Clock()
    counts = FailureCounts(limit=1, window_s=60, clock=clock, max_keys=2)
    counts.failed("alice")
    clock.now += 1
    counts.failed("bob")
    clock.now += 1
    counts.failed("carol")
    assert counts.locked_for_s("alice") == 0 and counts.locked_for_s("bob") > 0 and counts.locked_for_s("carol") > 0


# --- Flower's three counts -------------------------------------------------------------------


def test_a_flood_of_junk_usernames_does_not_flush_the_admins_count():
    # The attack that found the hole: 3 rounds of 4 wrong admin passwords, each followed by
    # 10,001 made-up usernames (one more than the table holds), all from one address.
    clock = Clock()
    flower = lockout(clock)
    refusals = []
    for _ in range(3):
        for _ in range(4):
            refusals.append(flower.refusal("admin", HOST))
            if refusals[-1] is None:
                flower.failed("admin", HOST)
            clock.now += 0.01
        for i in range(10_001):
            flower.failed(f"junk-{i}", HOST)
        clock.now += 1
    # The fifth wrong password locked the admin from that address: the rest were refused unseen,
    # and so is the right one now.
    assert [r is None for r in refusals] == [True] * 5 + [False] * 7
    assert flower.refusal("admin", HOST).scope is LockScope.SOURCE
    assert len(flower.unknown_sources) <= 10_000 and len(flower.known_sources) == 1


def test_made_up_usernames_are_locked_out_as_real_ones_are():
    flower = lockout()
    for _ in range(5):
        flower.failed("mallory", ELSEWHERE)
    assert flower.refusal("mallory", ELSEWHERE).scope is LockScope.SOURCE


def test_a_success_clears_the_count_of_its_source_only():
    flower = lockout()
    for _ in range(4):
        flower.failed("carol", HOST)
    flower.succeeded("carol", HOST)
    for _ in range(4):
        flower.failed("carol", HOST)
    assert flower.refusal("carol", HOST) is None


def test_the_lock_is_per_username_and_source():
    flower = lockout()
    for _ in range(5):
        flower.failed("carol", HOST)
    assert flower.refusal("carol", HOST) is not None
    assert flower.refusal("carol", ELSEWHERE) is None and flower.refusal("admin", HOST) is None
    assert flower.refusal("carol", JOB) is None


def test_a_guesser_spread_over_many_addresses_locks_the_username_for_other_machines_only():
    flower = lockout()
    for i in range(20):
        flower.failed("admin", remote(i))
    assert flower.refusal("admin", remote(1000)).scope is LockScope.USERNAME
    assert flower.refusal("admin", HOST) is None and flower.refusal("admin", JOB) is None
    assert flower.refusal("carol", remote(1000)) is None


def test_a_thousand_jobs_guessing_the_admins_password_lock_out_jobs_and_nobody_else():
    flower = lockout()
    guesses = 0
    for i in range(1000):
        for _ in range(4):
            if flower.refusal("admin", job(i)) is None:
                flower.failed("admin", job(i))
                guesses += 1
    assert guesses == 20
    assert flower.refusal("admin", job(5000)).scope is LockScope.USERNAME
    assert flower.refusal("admin", HOST) is None and flower.refusal("admin", ELSEWHERE) is None


def test_the_username_lock_ends_with_the_window():
    clock = Clock()
    flower = lockout(clock)
    for i in range(20):
        flower.failed("admin", remote(i))
    clock.now += 900
    assert flower.refusal("admin", remote(1000)) is None
