"""The run_slice message clockq writes itself is the one Celery and kombu would write: compared
key by key with what send_task pushes into the same Redis, so an upgrade that changes the format
fails here (a worker consuming these messages: tests/workers/test_delivery.py)."""

from __future__ import annotations

import base64
import json

from clockq.bus import celery_message, dispatch
from clockq.bus.client import client
from clockq.celery import app
from clockq.jobs.models import new_token

# Differ on every message.
_UNIQUE_HEADERS = {"id", "root_id"}
_UNIQUE_PROPERTIES = {"correlation_id", "delivery_tag"}


def _pushed(queue: str) -> tuple[list[bytes], dict]:
    r = client()
    keys = sorted(k for k in r.keys(f"{queue}*") if not k.startswith(b"_kombu"))
    assert keys == [queue.encode()], keys  # the queue's own list: priority 0, no key prefix
    raws = r.lrange(queue, 0, -1)
    r.delete(queue)
    return raws, json.loads(raws[0])


def test_the_message_is_the_one_send_task_writes():
    token = new_token()
    client().delete("bp")
    app.send_task(dispatch.RUN_SLICE_TASK, args=[42, token], queue="bp")
    _, celerys = _pushed("bp")
    dispatch.send_run_slice(42, token, "bp")
    _, ours = _pushed("bp")

    assert ours.keys() == celerys.keys()
    assert {k: v for k, v in ours.items() if k not in ("headers", "properties")} == {
        k: v for k, v in celerys.items() if k not in ("headers", "properties")
    }
    assert base64.b64decode(ours["body"]) == base64.b64decode(celerys["body"])
    assert ours["headers"].keys() == celerys["headers"].keys()
    for key in ours["headers"].keys() - _UNIQUE_HEADERS:
        assert ours["headers"][key] == celerys["headers"][key], key
    assert ours["headers"]["root_id"] == ours["headers"]["id"]
    assert ours["properties"].keys() == celerys["properties"].keys()
    for key in ours["properties"].keys() - _UNIQUE_PROPERTIES:
        assert ours["properties"][key] == celerys["properties"][key], key
    assert ours["properties"]["correlation_id"] == ours["headers"]["id"]


def test_every_message_has_its_own_ids():
    client().delete("bk")
    dispatch.send_run_slice(1, new_token(), "bk")
    dispatch.send_run_slice(1, new_token(), "bk")
    raws, _ = _pushed("bk")
    first, second = (json.loads(raw) for raw in raws)
    assert first["headers"]["id"] != second["headers"]["id"]
    assert first["properties"]["delivery_tag"] != second["properties"]["delivery_tag"]


def test_the_body_carries_only_the_job_and_its_token():
    token = new_token()
    message = json.loads(celery_message.encode(7, token, "sp"))
    args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
    assert args == [7, token] and kwargs == {}
    assert embed == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
