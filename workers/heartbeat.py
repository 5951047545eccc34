"""Each worker process announces that it is alive (clockq.bus.heartbeat); a GPU worker's parent
also publishes its GPU's telemetry while idle (the pool process publishes while a slice runs)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis

from clockq.bus import gpu_samples, heartbeat
from clockq.bus.client import client
from workers.probes import Probe

log = logging.getLogger("clockq.heartbeat")


def start(hostname: str, gpu_index: int | None, probe: Probe | None = None) -> threading.Thread:
    info = {
        "hostname": hostname,
        "gpu": gpu_index,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
    }

    def beat() -> None:
        while True:
            try:
                heartbeat.announce(client(), info)
                if probe is not None:
                    gpu_samples.publish(client(), probe.sample(), only_if_absent=True)
            except redis.RedisError as exc:
                log.warning("heartbeat for %s failed: %s", hostname, exc)
            time.sleep(heartbeat.INTERVAL_S)

    thread = threading.Thread(target=beat, name="clockq-heartbeat", daemon=True)
    thread.start()
    return thread
