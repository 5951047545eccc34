"""python manage.py submitdemo: a mixed sample workload across the five tiers."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from clockq.jobs import services, workloads

# (tier, name, workload, params): enough to see RT cut in, SP jobs take turns and BK wait.
DEMO_JOBS = [
    *[("BK", f"experiment-{i}", "synthetic", {"steps": 300, "step_ms": 10, "gpu_util": 0.3}) for i in range(4)],
    *[("BP", f"nightly-report-{i}", "matmul", {"size": 256, "steps": 400}) for i in range(2)],
    *[("SP", f"train-{i}", "synthetic", {"steps": 400, "step_ms": 10, "state_kb": 1024}) for i in range(3)],
    ("SP", "keras-regression", "keras_train", {"steps": 300}),
    ("HP", "finetune", "synthetic", {"steps": 200, "step_ms": 10, "state_kb": 256}),
    *[("RT", f"inference-{i}", "synthetic", {"steps": 3, "step_ms": 5}) for i in range(3)],
]


class Command(BaseCommand):
    help = "Submit a mixed sample workload across the five tiers, owned by the admin user."

    def handle(self, *args, **options):
        owner = get_user_model().objects.get(username="admin")
        for tier, name, workload, params in DEMO_JOBS:
            cleaned = workloads.validate(workload, params, may_run_commands=True)
            job = services.submit_job(owner=owner, name=name, tier_code=tier, workload=workload, params=cleaned)
            self.stdout.write(f"submitted #{job.pk} {name} ({tier}, {workload})")
