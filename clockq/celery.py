import os

from celery import Celery
from celery.app.utils import sanitize_url
from celery.signals import task_prerun
from celery.utils.serialization import strtobool
from celery.worker import control as celery_control
from celery.worker.control import inspect_command

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clockq.settings")

app = Celery("clockq")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers", "control", "predictor"])


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


def without_url_passwords(value):
    """`value` with the password of every URL in it masked, however deep in dicts and lists."""
    if isinstance(value, str):
        return sanitize_url(value) if "://" in value and "@" in value else value
    if isinstance(value, dict):
        return {key: without_url_passwords(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_url_passwords(item) for item in value]
    return value


@inspect_command(name="conf", signature="[include_defaults=False]", args=[("with_defaults", strtobool)])
def _conf_without_passwords(state, with_defaults=False, **kwargs):
    """Celery's `conf` reply, which Flower shows on each worker's page and in /api/workers, with
    every URL's password masked. Celery masks keys that look secret (SECRET_KEY, ...) and the
    key `broker_url`, but not the Django names it reads its settings under here
    (CELERY_BROKER_URL), nor settings such as REDIS_URL; both hold the broker's password.
    Registered under Celery's own name, it replaces that command in every clockq worker."""
    return without_url_passwords(celery_control.conf(state, with_defaults=with_defaults, **kwargs))
