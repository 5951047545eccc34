"""python manage.py gpuworkers: one pinned Celery worker per GPU on this host."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.management.base import BaseCommand

from workers.gpus import discover
from workers.launch import gpu_worker_argv, gpu_worker_env
from workers.supervisor import Child, Supervisor

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
        children = [
            Child(f"gpu{g.index}", gpu_worker_argv(g.index, loglevel=loglevel), gpu_worker_env(g)) for g in gpus
        ]
        raise SystemExit(Supervisor(children, stop_grace_s=stop_grace).run_forever())
