from django.apps import AppConfig
from django.core import checks


class JobsConfig(AppConfig):
    name = "clockq.jobs"
    label = "jobs"
    verbose_name = "clockq"

    def ready(self) -> None:
        from clockq.control_state.control import release_held
        from clockq.jobs.admission import on_release_held
        from clockq.jobs.tiers import check_tier_rows

        checks.register(check_workloads_have_specs)
        checks.register(check_tier_rows, checks.Tags.database)
        # The control state never imports the jobs: it says what its change lets go, and the
        # jobs held for admission are released here (clockq/jobs/admission.py).
        release_held.connect(on_release_held, dispatch_uid="clockq.jobs.admission.on_release_held")


def check_workloads_have_specs(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every workload enabled in settings needs a params schema, or no job could name it."""
    from django.conf import settings

    from clockq.jobs.workloads import SPECS

    return [
        checks.Error(
            f"CLOCKQ_WORKLOADS names {name!r}, which has no spec in clockq.jobs.workloads.SPECS",
            id="clockq.E001",
        )
        for name in settings.CLOCKQ_WORKLOADS
        if name not in SPECS
    ]
