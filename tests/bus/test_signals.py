"""Pub/sub interrupts through a real Redis."""

from __future__ import annotations

from clockq.bus import signals
from clockq.bus.client import client
from tests.harness import wait_for


def test_a_signal_sent_once_the_listener_is_subscribed_is_never_missed():
    assert signals.wait_until_listening(5.0)
    flags = signals.interrupts()
    signals.announce_job_changed(client(), 4242)
    wait_for(lambda: flags.poked(4242), 5, what="the signal to arrive")
    flags.clear(4242)
    assert not flags.poked(4242)


def test_an_urgent_job_is_announced_to_the_worker_with_its_tier():
    assert signals.wait_until_listening(5.0)
    flags = signals.interrupts()
    signals.announce_urgent(client(), 1)
    wait_for(lambda: flags.urgent.is_set(), 5, what="the urgent signal to arrive")
    assert flags.pending(7)  # a read made before it could have missed it
    assert flags.take_urgent() == 1
    assert flags.take_urgent() is None  # looked at once


def test_urgent_jobs_announced_before_a_look_are_looked_at_once_for_the_most_urgent():
    flags = signals.Interrupts()
    flags.handle(b'{"kind": "urgent", "rank": 1}')
    flags.handle(b'{"kind": "urgent", "rank": 0}')
    assert flags.take_urgent() == 0
    assert flags.take_urgent() is None


def test_a_malformed_signal_is_ignored():
    flags = signals.Interrupts()
    flags.handle(b'{"kind": "urgent"}')
    flags.handle(b"not json")
    assert flags.take_urgent() is None
