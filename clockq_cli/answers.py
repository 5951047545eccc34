"""The shape of each API answer the CLI reads, checked before any command reads it: a server that
is broken, hostile or not clockq gets one line naming what is wrong (`results[3].id is text, not a
whole number`) instead of a traceback from deep in a table.

Only what the CLI uses is checked; any other field may be anything, so a newer server that adds
fields still works. A field the CLI can do without may be missing or null."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class Malformed(Exception):
    """An answer that is not the shape clockq's API gives; the message says where and how."""


class Shape:
    def problems(self, value: Any, where: str) -> str | None:
        """None when `value` fits, else what is wrong with it, naming `where` it is."""
        raise NotImplementedError


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


@dataclass(frozen=True)
class Scalar(Shape):
    name: str
    types: tuple[type, ...]

    def problems(self, value: Any, where: str) -> str | None:
        # bool is an int to Python, never to the API: true is no job id.
        if not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types):
            return f"{where} is {_kind(value)}, not {self.name}"
        # JSON has no NaN or infinity, but Python's parser reads them: no duration is either.
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where} is {value}, not {self.name}"
        return None


@dataclass(frozen=True)
class Maybe(Shape):
    shape: Shape

    def problems(self, value: Any, where: str) -> str | None:
        return None if value is None else self.shape.problems(value, where)


@dataclass(frozen=True)
class ListOf(Shape):
    item: Shape

    def problems(self, value: Any, where: str) -> str | None:
        if not isinstance(value, list):
            return f"{where} is {_kind(value)}, not a list"
        for index, item in enumerate(value):
            if problem := self.item.problems(item, f"{where}[{index}]"):
                return problem
        return None


@dataclass(frozen=True)
class MapOf(Shape):
    """An object whose keys are names (metrics by name) and whose values are each `value`."""

    value: Shape

    def problems(self, value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} is {_kind(value)}, not an object"
        for key, item in value.items():
            if problem := self.value.problems(item, f"{where}.{key}"):
                return problem
        return None


@dataclass(frozen=True)
class Record(Shape):
    """An object with `required` fields, and `optional` ones that may be missing or null."""

    required: dict[str, Shape]
    optional: dict[str, Shape] = field(default_factory=dict)

    def problems(self, value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} is {_kind(value)}, not an object"
        for key, shape in self.required.items():
            if key not in value:
                return f"{where}.{key} is missing"
            if problem := shape.problems(value[key], f"{where}.{key}"):
                return problem
        for key, shape in self.optional.items():
            if value.get(key) is not None and (problem := shape.problems(value[key], f"{where}.{key}")):
                return problem
        return None


TEXT = Scalar("text", (str,))
WHOLE = Scalar("a whole number", (int,))
NUMBER = Scalar("a number", (int, float))
FLAG = Scalar("true or false", (bool,))
ANY = Scalar("a JSON value", (object,))
IDS = ListOf(WHOLE)


def check(answer: Any, shape: Shape) -> Any:
    """`answer` itself when it fits `shape`; Malformed, saying what is wrong, when not."""
    if problem := shape.problems(answer, "the answer"):
        raise Malformed(problem)
    return answer


JOB = Record(
    {"id": WHOLE, "name": TEXT, "owner": TEXT, "state": TEXT, "tier": TEXT},
    {
        "original_tier": TEXT,
        "workload": TEXT,
        "params": ANY,
        "progress": NUMBER,
        "wait_ms": NUMBER,
        "run_ms": NUMBER,
        "worker": TEXT,
        "submitted_at": TEXT,
        "first_started_at": TEXT,
        "finished_at": TEXT,
        "deadline": TEXT,
        "gpus": WHOLE,  # optional: a server older than multi-GPU jobs does not send it
        "slices": WHOLE,
        "checkpoint_generation": WHOLE,
        "failures": WHOLE,
        "pending_action": TEXT,
        "admission_note": TEXT,
        "placement_note": TEXT,
        "last_error": TEXT,
        "last_error_traceback": TEXT,
    },
)
JOBS = ListOf(JOB)
JOB_PAGE = Record({"count": WHOLE, "results": JOBS}, {"next": TEXT})
SLICE = Record(
    {},
    {
        "started_at": TEXT,
        "worker": TEXT,
        "gpu_index": WHOLE,
        "planned_ms": NUMBER,
        "used_ms": NUMBER,
        "steps": WHOLE,
        "outcome": TEXT,
        "rolled_back": FLAG,
        "checkpoint_ms": NUMBER,
        "restore_ms": NUMBER,
        "gpu_util": NUMBER,
    },
)
EVENT = Record({}, {"at": TEXT, "from_state": TEXT, "to_state": TEXT, "reason": TEXT, "actor": TEXT})
JOB_DETAIL = Record({**JOB.required}, {**JOB.optional, "slice_history": ListOf(SLICE), "events": ListOf(EVENT)})
CURVE = Record({}, {"points": ListOf(ListOf(NUMBER)), "latest": ListOf(Maybe(NUMBER))})
METRICS = Record({}, {"metrics": MapOf(CURVE)})
RESULT_FILE = Record({"name": TEXT}, {"bytes": WHOLE, "sha256": TEXT})
RESULT = Record({}, {"bytes": WHOLE, "files": ListOf(RESULT_FILE)})

TIER = Record(
    {"tier": TEXT},
    {"queue": TEXT, "waiting": WHOLE, "running": WHOLE, "held": WHOLE, "wait_target_ms": NUMBER, "use": TEXT},
)
WORKER_BEAT = Record({}, {"hostname": TEXT, "gpu": WHOLE, "host": TEXT, "started": NUMBER})
QUEUES = Record({"tiers": ListOf(TIER)}, {"workers": ListOf(WORKER_BEAT)})

_DRAIN = {"drained": FLAG, "drained_by": TEXT, "drain_reason": TEXT}
FLEET_WORKER = Record({"name": TEXT}, {**_DRAIN, "live": FLAG, "consuming": FLAG, "running_jobs": IDS})
HOST = Record(
    {"name": TEXT},
    {**_DRAIN, "live": FLAG, "roles": ListOf(TEXT), "running_jobs": IDS, "workers": ListOf(FLEET_WORKER)},
)
HOSTS = Record({"hosts": ListOf(HOST)})
# A drain or resume answers with the host or the worker it changed: a host has `workers`.
HOST_OR_WORKER = Record({"name": TEXT}, {**HOST.optional, **FLEET_WORKER.optional})

GPU = Record(
    {},
    {
        "host": TEXT,
        "gpu_index": WHOLE,
        "ts": NUMBER,
        "simulated": FLAG,
        "gpu_util": NUMBER,
        "mem_util": NUMBER,
        "mem_used_mib": NUMBER,
        "mem_total_mib": NUMBER,
        "power_w": NUMBER,
        "temperature_c": NUMBER,
        "process_count": WHOLE,
        "error": TEXT,
    },
)
GPUS = Record({"gpus": ListOf(GPU)}, {"now": NUMBER})
