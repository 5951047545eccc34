"""Real-GPU check: NVML discovery, a pinned worker, keras_train and matmul time-sliced on GPU 0.

Usage (on a host with an NVIDIA GPU; bench/gpu_check.sh prepares the environment):

    python bench/gpu_check.py [--gpu 0] [--timeout 240]

It starts its own redis-server and SQLite database in a temporary folder, one GPU worker pinned
to the GPU (`CLOCKQ_GPUS=<gpu>`, so `CUDA_VISIBLE_DEVICES=<gpu>`), submits a keras_train job and a
matmul job to the same tier so they share the GPU in time slices, and prints per-slice GPU
utilisation (from NVML), the planned slice lengths and why, and each job's measured switch cost.
Without a GPU it says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _harness import RedisServer, Service, wait_for  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for both jobs")
    parser.add_argument("--simulated", action="store_true", help="dry run of this script on a simulated GPU")
    args = parser.parse_args()
    started = time.monotonic()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clockq.settings")
    work = Path(tempfile.mkdtemp(prefix="clockq-gpu-check-"))
    os.environ.update(
        CLOCKQ_VAR_DIR=str(work / "var"), CLOCKQ_CHECKPOINT_DIR=str(work / "checkpoints"),
        DATABASE_URL=f"sqlite:///{work / 'check.sqlite3'}",
        CLOCKQ_GPUS=f"sim:{args.gpu + 1}" if args.simulated else str(args.gpu),
    )  # fmt: skip
    from workers.gpus import nvml_gpus, simulated_gpus

    print("== NVML discovery")
    try:
        gpus = simulated_gpus(args.gpu + 1) if args.simulated else nvml_gpus()
    except RuntimeError as exc:
        print(f"no NVIDIA GPU here: {exc}")
        return 2
    for gpu in gpus:
        print(f"GPU {gpu.index}: {gpu.name}, {gpu.memory_total_mib} MiB")
    if args.gpu not in {g.index for g in gpus}:
        print(f"GPU {args.gpu} not found")
        return 2

    redis_server = RedisServer(work).start()
    services: list[Service] = [redis_server]
    try:
        os.environ["REDIS_URL"] = redis_server.url
        env = dict(os.environ)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=120)
        workers = Service("gpuworkers", [sys.executable, "manage.py", "gpuworkers"], env, ROOT, work / "workers.log")
        services.append(workers.start())
        return run_check(args, workers, time.monotonic() - started)
    finally:
        for service in reversed(services):
            service.stop()
        shutil.rmtree(work, ignore_errors=True)


def run_check(args, workers: Service, setup_s: float) -> int:
    import django

    django.setup()
    from django.contrib.auth.models import User

    from webapp import services
    from webapp.models import Job
    from workers import broker, telemetry
    from workers.workloads import registry

    hostname = f"gpu{args.gpu}@{socket.gethostname()}"
    wait_for(lambda: (workers.check_alive(), broker.client().exists(f"clockq:worker:{hostname}"))[1], 90,
             f"worker {hostname}")  # fmt: skip
    print(f"== worker {hostname} is up (setup took {setup_s:.0f} s)")
    owner = User.objects.create(username="gpu-check", is_staff=True)
    jobs = [
        services.submit_job(owner=owner, name="keras", tier_code="SP", workload="keras_train",
                            params=registry.validate("keras_train", {"steps": 1500, "batch_size": 1024, "hidden": 1024},
                                                     is_staff=True)),
        services.submit_job(owner=owner, name="matmul", tier_code="SP", workload="matmul",
                            params=registry.validate("matmul", {"size": 1024, "steps": 400}, is_staff=True)),
    ]  # fmt: skip
    ids = [j.pk for j in jobs]

    def finished():
        workers.check_alive()
        return all(j.state in ("succeeded", "failed") for j in Job.objects.filter(pk__in=ids))

    wait_for(finished, args.timeout, "both jobs to finish", interval=0.5)

    print("== telemetry published by the worker")
    for sample in telemetry.cluster_samples(broker.client()):
        print("  ", sample.to_dict())
    for job in Job.objects.filter(pk__in=ids).order_by("pk"):
        print(f"== job {job.name} ({job.workload}): {job.state}, {job.slice_count} slices, "
              f"util EWMA {job.util_ewma}, switch cost {job.switch_cost_ms} ms {job.last_error[-300:]}")  # fmt: skip
        print(f"   {'#':>4} {'planned':>8} {'reason':>8} {'used':>6} {'util':>6} {'outcome':>9} {'ckpt ms':>8} "
              f"{'restore':>8}")  # fmt: skip
        for i, s in enumerate(job.slices.order_by("started_at")):
            util = "-" if s.gpu_util is None else f"{s.gpu_util:.0%}"
            print(f"   {i:>4} {s.planned_ms:>8} {s.plan_reason:>8} {s.used_ms:>6} {util:>6} {s.outcome:>9} "
                  f"{s.checkpoint_ms:>8.1f} {s.restore_ms:>8.1f}")  # fmt: skip
    ok = all(j.state == "succeeded" for j in Job.objects.filter(pk__in=ids))
    print("== GPU check", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
