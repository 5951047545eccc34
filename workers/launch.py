"""Command lines for clockq's Celery processes, in one place so every launcher agrees."""

from __future__ import annotations

import socket
import sys

from clockq.policy.tiers import QUEUES_IN_ORDER
from workers.gpus import Gpu


def _worker_argv(name: str, host: str | None, queues: str, pool: str, loglevel: str) -> list[str]:
    return [
        *(sys.executable, "-m", "celery", "-A", "clockq", "worker"),
        *("--hostname", f"{name}@{host or socket.gethostname()}"),
        *("--queues", queues, "--concurrency", "1", "--pool", pool, "--loglevel", loglevel),
        # Mingle and gossip sync state between workers at start; clockq keeps state in the
        # database, and skipping them saves seconds on every (re)start.
        *("--without-mingle", "--without-gossip"),
    ]


def gpu_worker_argv(gpu_index: int, host: str | None = None, loglevel: str = "INFO") -> list[str]:
    """One GPU worker: concurrency 1, consuming the five tier queues in strict order. Prefork,
    so the parent keeps heartbeating while a long slice runs; task events for Flower."""
    return [*_worker_argv(f"gpu{gpu_index}", host, ",".join(QUEUES_IN_ORDER), "prefork", loglevel), "--task-events"]


def gpu_worker_env(gpu: Gpu) -> dict[str, str]:
    """Pin the worker to its GPU, and tell it what kind of GPU that is."""
    return {
        "CUDA_VISIBLE_DEVICES": str(gpu.index),
        "CLOCKQ_GPU_INDEX": str(gpu.index),
        "CLOCKQ_GPU_SIMULATED": "1" if gpu.simulated else "0",
        "CLOCKQ_GPU_MEMORY_MIB": str(gpu.memory_total_mib),
    }


def control_worker_argv(host: str | None = None, loglevel: str = "INFO") -> list[str]:
    """The worker for beat's maintenance tasks (reconciler, lease reaper, ...)."""
    return _worker_argv("control", host, "control", "solo", loglevel)


def predictor_worker_argv(host: str | None = None, loglevel: str = "INFO") -> list[str]:
    """The load predictor's worker: the `predictor` queue only (forecast, training), one task
    at a time in its own process (solo), which keeps the loaded champion between forecasts. It
    is the one Celery process that loads TensorFlow."""
    return _worker_argv("predictor", host, "predictor", "solo", loglevel)
