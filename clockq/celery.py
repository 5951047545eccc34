import os

from celery import Celery
from celery.signals import task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clockq.settings")

app = Celery("clockq")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers", "predictor"])


@task_prerun.connect
def _drop_unusable_db_connections(sender=None, **_kwargs) -> None:
    """Before each task, as Django does before each request: close a connection that errored and
    fails its check, or is past CONN_MAX_AGE, so that a database restart costs one reconnect,
    not the task (connections are otherwise kept: CELERY_DB_REUSE_MAX in settings). Not for a
    task run eagerly, in its caller's process and maybe its transaction (as Celery's own
    Django fixup skips those)."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
