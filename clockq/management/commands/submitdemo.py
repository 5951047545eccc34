"""python manage.py submitdemo: a mixed sample workload across the five tiers, shaped so that the
dashboard (/dashboard) shows the scheduler at work within a minute or two:

- HP fine-tunes, one more than there are GPUs, so that every GPU stays busy and HP jobs take
  turns (a switch at every slice end) for a few minutes;
- SP training jobs starved behind them: each promotion tick (every 10 s) in which they get no
  slice is a skipped round, and after 3 the tick promotes them to HP for a rung of service, again and
  again while the HP work lasts (▲ and ★ on the slice timeline);
- RT inference arriving in waves while the GPUs are busy: a running job makes way at its next
  step (✕);
- BP and BK work that waits until the GPUs free up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from clockq.bus import heartbeat
from clockq.jobs import services, workloads
from clockq.policy.tiers import BK, BP, HP, RT, SP

DEFAULT_GPUS = 2  # when no GPU worker says otherwise


@dataclass(frozen=True)
class DemoJob:
    tier: str
    name: str
    workload: str
    params: dict[str, Any]


# About 200 s of GPU work each: HP keeps the GPUs for 5 min or so.
FINETUNE = {"steps": 20_000, "step_ms": 10, "state_kb": 256, "gpu_util": 0.9}
TRAIN = {"steps": 3_000, "step_ms": 10, "state_kb": 1024, "gpu_util": 0.7}
HP_FINETUNE = DemoJob(HP.code, "finetune-{i}", "synthetic", FINETUNE)
STARVED_SP = [
    *[DemoJob(SP.code, f"train-{i}", "synthetic", TRAIN) for i in range(3)],
    DemoJob(SP.code, "keras-regression", "keras_train", {"steps": 300}),
]
WAITING = [
    *[DemoJob(BP.code, f"nightly-report-{i}", "matmul", {"size": 256, "steps": 400}) for i in range(2)],
    *[
        DemoJob(BK.code, f"experiment-{i}", "synthetic", {"steps": 300, "step_ms": 10, "gpu_util": 0.3})
        for i in range(4)
    ],
]
RT_INFERENCE = DemoJob(RT.code, "inference-{wave}-{i}", "synthetic", {"steps": 3, "step_ms": 5})


class Command(BaseCommand):
    help = (
        "Submit a mixed sample workload across the five tiers, owned by the admin user: HP work that "
        "starves SP jobs until they are promoted, and waves of RT inference while the GPUs are busy."
    )

    def add_arguments(self, parser):
        parser.add_argument("--rt-waves", type=int, default=4, help="waves of RT inference (0: none)")
        parser.add_argument("--rt-first", type=float, default=5.0, help="seconds before the first RT wave")
        parser.add_argument("--rt-every", type=float, default=15.0, help="seconds between RT waves")

    def handle(self, *args, rt_waves: int, rt_first: float, rt_every: float, **options):
        owner = get_user_model().objects.get(username="admin")
        # HP first, so that the GPUs are busy with it before the SP jobs queue up behind.
        for i in range(max(self.gpu_count() + 1, 3)):
            self.submit(owner, replace(HP_FINETUNE, name=HP_FINETUNE.name.format(i=i)))
        for job in (*STARVED_SP, *WAITING):
            self.submit(owner, job)
        for wave in range(rt_waves):
            time.sleep(rt_first if wave == 0 else rt_every)  # arrive while the GPUs are busy
            for i in range(2):
                self.submit(owner, replace(RT_INFERENCE, name=RT_INFERENCE.name.format(wave=wave, i=i)))

    def submit(self, owner, job: DemoJob) -> None:
        cleaned = workloads.validate(job.workload, job.params, may_run_commands=True)
        made = services.submit_job(
            owner=owner, name=job.name, tier_code=job.tier, workload=job.workload, params=cleaned
        )
        self.stdout.write(f"submitted #{made.pk} {job.name} ({job.tier}, {job.workload})")

    @staticmethod
    def gpu_count() -> int:
        try:
            gpus = [w for w in heartbeat.live_workers() if w.get("gpu") is not None]
        except Exception:  # the broker is away: the demo still submits
            return DEFAULT_GPUS
        return len(gpus) or DEFAULT_GPUS
