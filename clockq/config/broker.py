"""The broker and Celery: the embedded Redis or REDIS_URL, the queues (one per tier, control and
predictor), what makes the tier order strict, and beat."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from clockq.config.paths import VAR_DIR
from clockq.env import embedded_redis_port, env_float, env_int, env_or_file, persistent_secret, redis_url_problem
from clockq.policy.tiers import QUEUES_IN_ORDER

# Without REDIS_URL, clockq uses the embedded broker that `make run` starts, with a password kept
# in a 0600 file, on CLOCKQ_EMBEDDED_REDIS_PORT, else the port `make run` recorded in var/redis.url
# when 6390 was taken (clockq/embedded_redis.py; manage.py and `celery -A clockq` read it here).
EMBEDDED_REDIS_PORT = env_int(
    "CLOCKQ_EMBEDDED_REDIS_PORT", embedded_redis_port(VAR_DIR), min_value=1024, max_value=65535
)
EMBEDDED_REDIS_PASSWORD_FILE = VAR_DIR / "redis-password"
_redis_url = env_or_file("REDIS_URL")
# True when this host uses the broker `make run` starts for itself: no other host can reach it.
CLOCKQ_EMBEDDED_BROKER = _redis_url is None
REDIS_URL = _redis_url or (
    f"redis://:{persistent_secret(EMBEDDED_REDIS_PASSWORD_FILE, nbytes=24)}@127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
)
if _problem := redis_url_problem(REDIS_URL):
    raise ImproperlyConfigured(f"REDIS_URL: {_problem}")

CONTROL_QUEUE = "control"
# The load predictor's worker consumes only this queue: it is the one process that loads TensorFlow.
PREDICTOR_QUEUE = "predictor"
_exchange = Exchange("clockq", type="direct")
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None  # the database holds every result that matters
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_QUEUES = [
    Queue(name, _exchange, routing_key=name) for name in (*QUEUES_IN_ORDER, CONTROL_QUEUE, PREDICTOR_QUEUE)
]
CELERY_TASK_ROUTES = {
    "clockq.forecast": {"queue": PREDICTOR_QUEUE},
    "clockq.train_predictor": {"queue": PREDICTOR_QUEUE},
}
CELERY_TASK_DEFAULT_QUEUE = CONTROL_QUEUE
CELERY_TASK_DEFAULT_EXCHANGE = "clockq"
CELERY_TASK_DEFAULT_ROUTING_KEY = CONTROL_QUEUE
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup closes every database connection before and after each task unless this
# is set: a reconnect per slice switch (1.2 ms on SQLite, more on PostgreSQL). With it, a worker
# keeps its connection; clockq/celery.py still drops one that is broken or older than
# CONN_MAX_AGE before each task, as Django does per request.
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Messages are only wake-ups; the reconciler re-dispatches any queued job whose message is gone
# within seconds. So the visibility timeout only needs to outlast the longest run of continued
# slices, to keep Redis from re-delivering a message whose task is still working. A re-delivery
# is harmless anyway: the claim's compare-and-set drops it.
VISIBILITY_TIMEOUT_S = env_int("CLOCKQ_VISIBILITY_TIMEOUT_S", 6 * 3600, min_value=60)
# A broker that hangs (paused, a half-open connection) must fail a command in this time, not
# block it: a web request that publishes, or a slice boundary, would otherwise wait as long as
# the broker does. Commands on a healthy Redis take well under a millisecond.
CLOCKQ_BROKER_TIMEOUT_S = env_float("CLOCKQ_BROKER_TIMEOUT_S", 0.5, min_value=0.05, max_value=60.0)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "queue_order_strategy": "priority",
    "visibility_timeout": VISIBILITY_TIMEOUT_S,
    "socket_timeout": CLOCKQ_BROKER_TIMEOUT_S,
    "socket_connect_timeout": CLOCKQ_BROKER_TIMEOUT_S,
}
# django-celery-beat's DatabaseScheduler, one beat at a time (control/beat.py).
CELERY_BEAT_SCHEDULER = "control.beat:LockedDatabaseScheduler"
# Beat writes each task's last run back to the database after every send, not every 3 minutes:
# /metrics tells a live beat by it (clockq_beat_last_run_timestamp_seconds), and a beat that
# restarts does not send again what it sent in the last minutes. A few small UPDATEs a minute.
CELERY_BEAT_SYNC_EVERY = 1

# The control role's maintenance, which beat writes into its schedule at each start with these
# periods (clockq/jobs/periodic.py, the one list of periodic tasks).
RECONCILE_EVERY_S = env_int("CLOCKQ_RECONCILE_EVERY_S", 15, min_value=1)
RETENTION_EVERY_S = env_int("CLOCKQ_RETENTION_EVERY_S", 3600, min_value=1)
REAP_EVERY_S = env_int("CLOCKQ_REAP_EVERY_S", 10, min_value=1)
