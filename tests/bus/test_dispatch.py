"""Dispatch messages on the real broker: a batch goes out over one pipeline, each message in its
tier's queue (a broker outage during a submit: tests/webapp/test_broker_outage.py)."""

from __future__ import annotations

import json

from clockq.bus import dispatch
from clockq.bus.client import client
from clockq.jobs.models import new_token


def test_a_batch_of_dispatches_lands_in_its_queues_in_order():
    r = client()
    r.delete("bk", "rt")
    tokens = [new_token() for _ in range(3)]
    messages = [(101, tokens[0], "bk"), (102, tokens[1], "rt"), (103, tokens[2], "bk")]

    assert dispatch.publish_dispatches(messages) == 3

    assert r.llen("bk") == 2 and r.llen("rt") == 1
    bodies = [json.loads(raw) for raw in r.lrange("bk", 0, -1)]  # LPUSH: newest first
    assert [b["headers"]["argsrepr"] for b in reversed(bodies)] == [f"[101, '{tokens[0]}']", f"[103, '{tokens[2]}']"]
    assert all(b["headers"]["task"] == dispatch.RUN_SLICE_TASK for b in bodies)
    r.delete("bk", "rt")
