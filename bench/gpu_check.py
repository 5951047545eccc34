"""Real-GPU check: NVML telemetry, a pinned worker, and Keras training time-sliced on one GPU.

Usage (on a host with an NVIDIA GPU; bench/gpu_check.sh prepares the environment):

    python bench/gpu_check.py [--gpu 0] [--timeout 240] [--simulated]

It starts its own redis-server and SQLite database in a temporary folder and one GPU worker
pinned to the GPU (`CLOCKQ_GPUS=<gpu>`, so `CUDA_VISIBLE_DEVICES=<gpu>`). Then:

1. it reads the GPU once through `NvmlProbe` and prints every dimension;
2. it submits two `keras_train` jobs to the same tier, a small model and a large one, so they
   share the GPU in time slices, and a few RT jobs while they run;
3. it prints, per slice, the GPU utilisation NVML measured, the planned length and why, the
   checkpoint and restore times, and each job's measured switch cost; and the RT jobs' waits.
4. it measures RT behind a 200 MB Keras job two ways: paused in place in the GPU's RT lane, and
   through the checkpoint path (the workers restarted with CLOCKQ_RT_LANE=off).

It passes when NVML reads the GPU without error, both training jobs succeed after yielding to
each other, their slices carry measured utilisation, and every RT job ran, both ways. Keras uses the
backend in KERAS_BACKEND (TensorFlow unless set). `--simulated` runs the same script on a
simulated GPU, to check the script itself. Without a GPU it says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _harness import Service, private_clockq, turn_ladder, wait_for  # noqa: E402

TRAINING = {
    # A model small enough that the GPU mostly waits on Python, and one that keeps it busy.
    "keras-small": {"steps": 600, "batch_size": 64, "hidden": 64, "seed": 1},
    "keras-large": {"steps": 300, "batch_size": 4096, "hidden": 4096, "seed": 2},
}
# The same shapes, cut down for a dry run on a CPU.
TRAINING_SIMULATED = {
    "keras-small": {"steps": 150, "batch_size": 16, "hidden": 16, "seed": 1},
    "keras-large": {"steps": 60, "batch_size": 256, "hidden": 256, "seed": 2},
}
RT_JOBS = 3
RT_PARAMS = {"steps": 2, "step_ms": 1.0, "state_kb": 0}  # an RT inference: two 1 ms steps
# RT behind one large Keras job, two ways (`rt_behind_keras`). hidden 4096: about 202 MB of
# state (two 4096-wide layers' weights and Adam's two moments), as in the earlier H200 check.
KERAS_200MB = {"steps": 1_000_000, "batch_size": 1024, "hidden": 4096, "seed": 3}
KERAS_200MB_SIMULATED = {**KERAS_200MB, "batch_size": 64, "hidden": 512}
RT_BEHIND = 5  # RT jobs each way, one at a time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the jobs")
    parser.add_argument("--simulated", action="store_true", help="dry run of this script on a simulated GPU")
    args = parser.parse_args()
    started = time.monotonic()

    gpus_setting = f"sim:{args.gpu + 1}" if args.simulated else str(args.gpu)
    with private_clockq("clockq-gpu-check-", CLOCKQ_GPUS=gpus_setting) as stack:
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
        probe_ok = read_gpu_once(args)

        # Jobs of one class never displace one another (clockq/policy/ordering.py): a ladder with
        # a rung every 0.9 SP slice makes the two training jobs take turns, as in the benches.
        from clockq.jobs.models import QueueTier

        stack.setenv(CLOCKQ_SERVICE_LADDER_S=turn_ladder(QueueTier.objects.get(code="SP").base_slice_ms, 2000))
        workers = Service(
            "gpuworkers", [sys.executable, "manage.py", "gpuworkers"], stack.env, ROOT, stack.work / "workers.log"
        )
        stack.services.append(workers.start())
        try:
            jobs_ok = run_jobs(args, workers, time.monotonic() - started)
            jobs_ok &= rt_behind_keras(args, stack, workers)
        except TimeoutError as exc:
            print(f"== {exc}\n-- last lines of the worker log:\n{stack.services[-1].tail(40)}")
            jobs_ok = False
    ok = probe_ok and jobs_ok
    print(f"== GPU check {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


def read_gpu_once(args) -> bool:
    """One reading through the probe a worker uses: every dimension, and no error."""
    from workers.probes import make_probe

    sample = make_probe(args.gpu, simulated=args.simulated).sample()
    print("== one NVML reading of GPU", args.gpu)
    for name, value in sample.to_dict().items():
        print(f"   {name:>15}: {value}")
    ok = sample.error is None and sample.gpu_util is not None and bool(sample.mem_total_mib)
    if not ok:
        print("   the probe did not read the GPU cleanly")
    return ok


def run_jobs(args, workers: Service, setup_s: float) -> bool:
    from django.contrib.auth.models import User

    from clockq.bus import gpu_samples
    from clockq.bus.client import client
    from clockq.bus.heartbeat import KEY_PREFIX
    from clockq.jobs.models import Job, Slice

    hostname = f"gpu{args.gpu}@{socket.gethostname()}"

    def worker_up() -> bool:
        workers.check_alive()
        return bool(client().exists(KEY_PREFIX + hostname))

    wait_for(worker_up, 90, f"worker {hostname}")
    print(f"== worker {hostname} is up (setup took {setup_s:.0f} s); Keras backend {keras_backend()}")
    owner = User.objects.create(username="gpu-check")
    shapes = TRAINING_SIMULATED if args.simulated else TRAINING
    training = [submit(owner, name, "SP", "keras_train", params).pk for name, params in shapes.items()]

    def all_finished(ids: list[int]) -> bool:
        return finished(workers, ids)

    # RT jobs arrive once training has taken steps (an RT job cannot cut into a job's setup,
    # only into its steps), one at a time, each preempting a training slice.
    wait_for(lambda: Slice.objects.filter(job_id__in=training).exists(), 120, "training to start")
    rt = []
    for i in range(RT_JOBS):
        time.sleep(1.0)
        rt.append(submit(owner, f"rt-{i}", "RT", "synthetic", RT_PARAMS).pk)
        wait_for(lambda: all_finished(rt), 60, f"RT job {i} to finish", interval=0.01)
    wait_for(lambda: all_finished(training), args.timeout, "the training jobs to finish", interval=0.5)

    print("== telemetry published by the worker")
    for sample in gpu_samples.cluster_samples(client()):
        print("  ", sample.to_dict())
    ok = True
    utils: dict[str, float] = {}
    for job in Job.objects.filter(pk__in=training).order_by("pk"):
        slices = list(job.slices.order_by("started_at"))
        measured = [s.gpu_util for s in slices if s.gpu_util is not None]
        yielded = sum(s.outcome == "yielded" for s in slices)
        utils[job.name] = statistics.fmean(measured) if measured else float("nan")
        print(
            f"== job {job.name}: {job.state}, {job.slice_count} slices ({yielded} yielded), "
            f"mean slice util {utils[job.name]:.0%}, util EWMA {job.util_ewma}, switch cost {job.switch_cost_ms} ms"
        )
        if job.last_error:
            print("   error:", job.last_error[-600:])
        header = ("#", "planned", "reason", "used", "util", "outcome", "ckpt ms", "restore")
        print("   " + " ".join(f"{h:>{w}}" for h, w in zip(header, (4, 8, 8, 6, 6, 9, 8, 8), strict=True)))
        for i, s in enumerate(slices):
            util = "-" if s.gpu_util is None else f"{s.gpu_util:.0%}"
            print(
                f"   {i:>4} {s.planned_ms:>8} {s.plan_reason:>8} {s.used_ms:>6} {util:>6} {s.outcome:>9} "
                f"{s.checkpoint_ms:>8.1f} {s.restore_ms:>8.1f}"
            )
        ok &= job.state == "succeeded" and yielded > 0 and len(measured) == len(slices)
    for job in Job.objects.filter(pk__in=rt).order_by("pk"):
        wait_ms = (job.first_started_at - job.submitted_at).total_seconds() * 1000 if job.first_started_at else None
        print(f"== RT job {job.name}: {job.state}, submitted to claimed {wait_ms:.1f} ms")
        ok &= job.state == "succeeded"
    return ok


def rt_behind_keras(args, stack, workers: Service) -> bool:
    """RT behind a 200 MB Keras job, paused in place in the GPU's RT lane (gpuworkers as
    started: lanes on), then through the checkpoint path (gpuworkers restarted with
    CLOCKQ_RT_LANE=off). Each RT job declares 256 MiB, which fits beside the Keras job."""
    from clockq.bus import lanes
    from clockq.bus.client import client
    from clockq.bus.heartbeat import KEY_PREFIX

    main = f"gpu{args.gpu}@{socket.gethostname()}"
    lane = lanes.lane_name(main)
    wait_for(lambda: client().zscore(lanes.IDLE_KEY, lane) is not None, 90, f"RT lane {lane}")
    ok = rt_behind_keras_one_way(args, workers, "paused in place")

    workers.stop()
    env = {**stack.env, "CLOCKQ_RT_LANE": "off"}
    workers = Service("gpuworkers", workers.argv, env, ROOT, stack.work / "workers-no-lane.log").start()
    stack.services.append(workers)
    client().delete(KEY_PREFIX + main)
    wait_for(lambda: bool(client().exists(KEY_PREFIX + main)), 90, f"worker {main} without its lane")
    return rt_behind_keras_one_way(args, workers, "checkpoint path") and ok


def rt_behind_keras_one_way(args, workers: Service, way: str) -> bool:
    """RT_BEHIND RT jobs, one at a time, each while the Keras job runs its steps."""
    from django.contrib.auth.models import User

    from clockq.bus import lanes
    from clockq.jobs import services
    from clockq.jobs.models import Job

    owner = User.objects.get(username="gpu-check")
    params = KERAS_200MB_SIMULATED if args.simulated else KERAS_200MB
    served = lanes.served()
    big = submit(owner, "keras-200mb", "SP", "keras_train", params, gpu_mem_mib=2048)
    wait_for(lambda: Job.objects.get(pk=big.pk).progress > 0, 180, "the 200 MB Keras job to take steps")
    waits, states = [], []
    for i in range(RT_BEHIND):
        wait_for(lambda: running(workers, big.pk), 120, "the Keras job to run again")
        time.sleep(0.5)  # into its steps, past its claim
        rt = submit(owner, f"rt-behind-{i}", "RT", "synthetic", RT_PARAMS, gpu_mem_mib=256)
        wait_for(lambda job=rt: finished(workers, [job.pk]), 60, f"RT job {i}", interval=0.01)
        rt.refresh_from_db()
        states.append(rt.state)
        if rt.first_started_at:
            waits.append((rt.first_started_at - rt.submitted_at).total_seconds() * 1000)
    big.refresh_from_db()
    services.cancel_job(big, "gpu-check")
    hidden = params["hidden"]
    state_mb = 12 * (hidden * hidden + 19 * hidden + 1) / 2**20  # weights and two moments, float32
    after = lanes.served()
    paths = {k: after.get(k, 0) - served.get(k, 0) for k in after if after.get(k, 0) != served.get(k, 0)}
    print(
        f"== RT behind a {state_mb:.0f} MB Keras job ({way}): {states.count('succeeded')}/{RT_BEHIND} "
        f"succeeded; wait p50 {statistics.median(waits) if waits else float('nan'):.1f} ms, "
        f"max {max(waits, default=float('nan')):.1f} ms; lanes served {paths or 'none'}"
    )
    return states == ["succeeded"] * RT_BEHIND


def submit(owner, name: str, tier: str, workload: str, params: dict, gpu_mem_mib: int | None = None):
    """Submit a job as the check's user, through the same validation as the API."""
    from clockq.jobs import services, workloads

    cleaned = workloads.validate(workload, params, may_run_commands=True)
    return services.submit_job(
        owner=owner, name=name, tier_code=tier, workload=workload, params=cleaned, gpu_mem_mib=gpu_mem_mib
    )


def finished(workers: Service, ids: list[int]) -> bool:
    """Whether every job of `ids` has ended (the workers still alive)."""
    from clockq.jobs.models import Job

    workers.check_alive()
    return not Job.objects.filter(pk__in=ids, state__in=["queued", "running", "held"]).exists()


def running(workers: Service, job_id: int) -> bool:
    from clockq.jobs.models import Job

    workers.check_alive()
    return Job.objects.filter(pk=job_id, state="running").exists()


def keras_backend() -> str:
    return os.environ.get("KERAS_BACKEND", "tensorflow")


if __name__ == "__main__":
    sys.exit(main())
