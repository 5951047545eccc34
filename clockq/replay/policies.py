"""The replayable policies by name."""

from __future__ import annotations

from clockq.replay.baselines import FifoReplay, LasReplay, PriorityReplay
from clockq.replay.clockq_policy import ClockqReplay
from clockq.replay.config import Config
from clockq.replay.engine import Replay
from clockq.replay.model import RunResult, Trace

POLICIES: dict[str, type[Replay]] = {
    "fifo": FifoReplay,
    "priority": PriorityReplay,
    "las": LasReplay,
    "clockq": ClockqReplay,
}


def replay(trace: Trace, policy: str, config: Config) -> RunResult:
    try:
        cls = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}") from None
    return cls(trace, config).run()
