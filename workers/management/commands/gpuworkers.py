"""python manage.py gpuworkers: one pinned Celery worker per GPU on this host."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.management.base import BaseCommand

from clockq.stack.roles import gpu_worker_argv
from clockq.stack.supervisor import Child, Supervisor
from workers import sandbox
from workers.gpus import discover, gpu_worker_env
from workers.prefetch import Prefetcher
from workers.workloads.base import JobRefused

log = logging.getLogger("clockq.gpuworkers")


class Command(BaseCommand):
    help = "Start one Celery worker per GPU (CLOCKQ_GPUS), restart any that dies, stop all on SIGTERM."

    def add_arguments(self, parser):
        parser.add_argument("--loglevel", default="INFO")
        parser.add_argument(
            "--stop-grace",
            type=float,
            default=60.0,
            help="seconds to let running slices checkpoint before killing workers",
        )

    def handle(self, *args, loglevel, stop_grace, **options):
        gpus = discover(settings.CLOCKQ_GPUS, settings.CLOCKQ_SIM_GPU_MEMORY_MIB)
        for gpu in gpus:
            kind = "simulated" if gpu.simulated else "NVML"
            self.stdout.write(f"GPU {gpu.index}: {gpu.name} ({gpu.memory_total_mib} MiB, {kind})")
        self.stdout.write(self._how_commands_run())
        children = [
            Child(f"gpu{g.index}", gpu_worker_argv(g.index, loglevel=loglevel), gpu_worker_env(g)) for g in gpus
        ]
        if settings.CLOCKQ_PREFETCH_EVERY_S:
            Prefetcher(
                gpus, settings.CLOCKQ_CACHE_DIR, settings.CLOCKQ_PREFETCH_EVERY_S, settings.CLOCKQ_PREFETCH_JOBS_PER_GPU
            ).start()
        raise SystemExit(Supervisor(children, stop_grace_s=stop_grace).run_forever())

    @staticmethod
    def _how_commands_run() -> str:
        """Say at startup what becomes of `command` jobs here, and why if they are refused."""
        try:
            return sandbox.sandbox_for_commands().describe()
        except JobRefused as exc:
            return f"command jobs: refused on this host: {exc}"
