"""Pub/sub interrupts through a real Redis."""

from __future__ import annotations

from clockq.bus import signals
from clockq.bus.client import client
from tests.harness import wait_for


def test_a_signal_sent_once_the_listener_is_subscribed_is_never_missed():
    assert signals.wait_until_listening(5.0)
    flags = signals.interrupts()
    signals.announce_job_changed(client(), 4242)
    wait_for(lambda: flags.should_end_slice(4242, rank=2), 5, what="the signal to arrive")
    flags.clear(4242)
    assert not flags.should_end_slice(4242, rank=2)


def test_an_rt_signal_ends_lower_tiers_slices_only():
    assert signals.wait_until_listening(5.0)
    flags = signals.interrupts()
    signals.announce_rt_waiting(client())
    wait_for(lambda: flags.should_end_slice(1, rank=2), 5, what="the RT signal to arrive")
    assert not flags.should_end_slice(1, rank=0)  # an RT job is not preempted by another
    flags.clear(1)
