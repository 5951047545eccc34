"""python manage.py gpuworkers: one pinned Celery worker per GPU on this host."""

from __future__ import annotations

import logging
import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from clockq.bus import names
from clockq.bus.client import client
from clockq.fleet import registry
from clockq.stack.roles import gpu_worker_argv, rt_lane_argv
from clockq.supervision import records
from clockq.supervision.supervisor import Child, Supervisor
from workers import sandbox
from workers.gpus import discover, gpu_worker_env
from workers.prefetch import Prefetcher
from workers.rt_lane import rt_lane_env
from workers.workloads.base import JobRefused

log = logging.getLogger("clockq.gpuworkers")

BROKER_WAIT_S = 60.0


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
        if settings.CLOCKQ_RT_LANE:
            self.stdout.write(
                f"RT lanes: one per GPU; a job paused for one checkpoints after {settings.CLOCKQ_PAUSE_MAX_S} s"
            )
        self.stdout.write(self._how_commands_run())
        worker_names = {g.index: f"gpu{g.index}@{settings.CLOCKQ_HOST}" for g in gpus}
        lane_names = {g.index: f"rt{g.index}@{settings.CLOCKQ_HOST}" for g in gpus} if settings.CLOCKQ_RT_LANE else {}
        held = [*worker_names.values(), *lane_names.values()]
        instance = self._claim_names(held)
        registry.register_gpu_workers(settings.CLOCKQ_HOST, [(name, i) for i, name in worker_names.items()])
        keeper = names.Keeper(client, held, instance).start()
        children = [
            Child(
                f"gpu{g.index}",
                gpu_worker_argv(g.index, loglevel=loglevel),
                {**gpu_worker_env(g), names.INSTANCE_ENV: instance},
            )
            for g in gpus
        ]
        # Each GPU's standby RT lane (workers/rt_lane.py), pinned to the same GPU, started warm.
        children += [
            Child(
                f"rt{g.index}",
                rt_lane_argv(g.index, loglevel=loglevel),
                {**gpu_worker_env(g), names.INSTANCE_ENV: instance, **rt_lane_env(worker_names[g.index])},
            )
            for g in gpus
            if g.index in lane_names
        ]
        if settings.CLOCKQ_PREFETCH_EVERY_S:
            Prefetcher(
                gpus, settings.CLOCKQ_CACHE_DIR, settings.CLOCKQ_PREFETCH_EVERY_S, settings.CLOCKQ_PREFETCH_JOBS_PER_GPU
            ).start()
        try:
            record_dir = records.record_dir(settings.VAR_DIR)
            code = Supervisor(children, stop_grace_s=stop_grace, name="gpuworkers", record_dir=record_dir).run_forever()
        finally:
            keeper.stop()
        raise SystemExit(code)

    def _claim_names(self, worker_names: list[str]) -> str:
        """Hold this host's worker names (clockq/bus/names.py), or refuse to start: a live worker
        elsewhere has one."""
        instance = names.new_instance()

        def on_wait(name: str, holder: str) -> None:
            self.stdout.write(f"{name} is held by {holder}; waiting up to {names.TTL_S} s to see if it is alive")

        deadline = time.monotonic() + BROKER_WAIT_S  # `make run` starts its broker beside this
        while True:
            try:
                names.claim(client(), worker_names, instance, on_wait=on_wait)
                return instance
            except names.NameTaken as exc:
                raise CommandError(str(exc)) from None
            except redis.RedisError as exc:
                if time.monotonic() > deadline:
                    raise CommandError(f"cannot reach the broker (REDIS_URL) to claim {worker_names}: {exc}") from None
            time.sleep(0.5)

    @staticmethod
    def _how_commands_run() -> str:
        """Say at startup what becomes of `command` jobs here, and why if they are refused."""
        try:
            return sandbox.sandbox_for_commands().describe()
        except JobRefused as exc:
            return f"command jobs: refused on this host: {exc}"
