"""The run_slice wake-up as Celery (task protocol 2) and kombu's Redis transport store it: one
JSON document pushed onto the tier queue's list.

Why not `app.send_task`: at a yield, the requeue's message is on the GPU's critical path, and
send_task spends most of a publish on Celery's settings lookups and protocol builder and on a new
Redis client object that kombu makes for every message, not on the LPUSH it ends in (the
measurement is in docs/benchmarks.md). The message is the same every time but for the job id,
the token, the queue and two uuids, so it is written here, and pushed with clockq's own Redis
client (clockq/bus/client.py), whose timeouts and retry the broker's other users share.

The format is Celery's and kombu's, not ours: tests/bus/test_celery_message.py publishes the same
message with send_task and compares the two, key by key, and the key they land in. An upgrade of
Celery or kombu that changes the format fails that test, not the workers.

What the format assumes, and settings.py keeps true: JSON serialisation, no task priority (so the
list is the queue's own name under the "priority" queue order strategy), no global key prefix in
the broker's transport options, and the anonymous exchange (clockq/bus/dispatch.py says why).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from functools import cache

TASK_NAME = "clockq.run_slice"
# The body's third element: no callbacks, errbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@cache
def _hostname() -> str:
    return socket.gethostname()


def encode(job_id: int, token: str, queue: str, reply_to: str = "") -> bytes:
    """The message, as kombu stores it in Redis. `reply_to` is the sender's Celery oid (only
    results would go there, and run_slice stores none)."""
    task_id = str(uuid.uuid4())
    args = [job_id, token]
    body = json.dumps([args, {}, _EMBED]).encode()
    message = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": TASK_NAME,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": repr(args),
            "kwargsrepr": "{}",
            # Celery's anonymous node name for a sender that is not a worker: gen<pid>@<host>.
            "origin": f"gen{os.getpid()}@{_hostname()}",
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": reply_to,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(message).encode()
