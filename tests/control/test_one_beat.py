"""Exactly one beat: of two real beat processes one leads and sends the periodic tasks, the
other waits on the lock; when the leader is killed with kill -9, the other takes over within one
lease (CLOCKQ_BEAT_LOCK_S) and sends them from then on."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from clockq.bus.beat_lock import LOCK_KEY
from clockq.stack.roles import beat_argv
from tests.harness import ROOT, Service, wait_for
from tests.helpers import database_url

pytestmark = pytest.mark.integration

LEASE_S = 4
SENT = "Sending due task clockq: reconcile queued jobs"


def _leader_pid(r: redis.Redis) -> int | None:
    raw = r.get(LOCK_KEY)
    return int(raw.decode().split(":")[1]) if raw else None


def test_one_of_two_beats_sends_and_the_other_takes_over_within_a_lease_when_it_dies(
    transactional_db, redis_server, tmp_path
):
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_server.url,
        "CLOCKQ_BEAT_LOCK_S": str(LEASE_S),
        "CLOCKQ_RECONCILE_EVERY_S": "1",  # something due every second, to see who sends
    }
    beats = [
        Service(f"beat {i}", [*beat_argv(), "--max-interval", "1"], env, ROOT, tmp_path / f"beat{i}.log")
        for i in range(2)
    ]
    r = redis.Redis.from_url(redis_server.url)
    try:
        for beat in beats:
            beat.start()
        by_pid = {beat.proc.pid: beat for beat in beats}

        # Given one beat leading: it sends, the other only waits

        def leader() -> int | None:
            for beat in beats:
                beat.check_alive()
            return _leader_pid(r)

        first = by_pid[wait_for(leader, 60, what="a beat to take the lock")]
        second = next(b for b in beats if b is not first)
        wait_for(lambda: SENT in first.log_text(), 30, what="the leader to send a periodic task")
        wait_for(lambda: "waits:" in second.log_text(), 30, what="the other beat to wait on the lock")
        first.check_alive(), second.check_alive()
        assert SENT not in second.log_text()

        # When the leader is killed outright (no chance to give the lock up)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)

        # Then the other takes the lock once its lease has run out, and sends from then on. (The
        # wait's limit is the lease, plus the waiting beat's one-second tries and a start margin.)
        wait_for(lambda: _leader_pid(r) == second.proc.pid, LEASE_S + 3, what="the second beat to take over")
        wait_for(lambda: SENT in second.log_text(), 30, what="the new leader to send a periodic task")
        assert "took the beat lock" in second.log_text()
    finally:
        for beat in beats:
            beat.stop(grace_s=10)
    # A beat that stops gracefully gives its lock up
    assert r.get(LOCK_KEY) is None
