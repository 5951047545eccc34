"""clockq settings. Every value comes from the environment; a bad one raises ImproperlyConfigured."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import socket
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from clockq.env import (
    embedded_redis_port,
    env_bool,
    env_choice,
    env_float,
    env_float_list,
    env_int,
    env_int_list,
    env_list,
    env_or_file,
    env_str,
    host_name_problem,
    parse_gpus,
    parse_scale_hook,
    persistent_secret,
    redis_url_problem,
)
from clockq.logs import logging_config
from clockq.policy import affinity as _affinity
from clockq.policy import control as _control
from clockq.policy.ordering import BASE_LADDER_GPU_S, Ladder
from clockq.policy.tiers import QUEUES_IN_ORDER

BASE_DIR = Path(__file__).resolve().parent.parent
# Every file a clockq process makes (the SQLite database, secrets, checkpoints, logs) is its own:
# other users, the uids that run jobs' programs among them, cannot read it.
os.umask(0o077)
VAR_DIR = Path(env_str("CLOCKQ_VAR_DIR") or BASE_DIR / "var")

# DATABASE_URL, REDIS_URL, SECRET_KEY, CLOCKQ_CHECKPOINT_DIR and the other secrets may each come
# from a file instead, named by the same variable with _FILE (Docker and Kubernetes secrets).
SECRET_KEY = env_or_file("SECRET_KEY") or persistent_secret(VAR_DIR / "secret_key")
if len(SECRET_KEY) < 32:
    raise ImproperlyConfigured(
        "SECRET_KEY is shorter than 32 characters: use a long random value, e.g. from "
        "`python -c 'import secrets; print(secrets.token_urlsafe(48))'`, or leave it unset on one machine"
    )
# Sessions are in the database, signed with SECRET_KEY (kept in var/secret_key): a restart keeps
# users logged in. Cookies belong to a host name, not a port: two clockqs on one machine would
# overwrite each other's, so their names carry a digest of SECRET_KEY (one per cluster).
_COOKIE_TAG = hashlib.sha256(b"clockq cookie names\0" + SECRET_KEY.encode()).hexdigest()[:10]
SESSION_COOKIE_NAME = f"clockq_session_{_COOKIE_TAG}"
CSRF_COOKIE_NAME = f"clockq_csrf_{_COOKIE_TAG}"
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",  # the OpenAPI schema at /api/schema
    "knox",  # API tokens, stored hashed
    "axes",  # login throttling and lockout
    "django_celery_beat",
    "clockq",  # management commands that act on the whole system (runstack, ensureadmin)
    "clockq.jobs",  # the domain: jobs, tiers, slices, quotas
    "clockq.kpis",  # the KPI rollups
    "clockq.control_state",  # admission, prefetch and desired workers, and their audit trail
    "clockq.forecasting",  # the load predictor's storage: load history, models, forecasts
    "clockq.fleet",  # the hosts and GPU workers: the registry, drains, the checkpoint folder's marker
    "webapp",
    "workers",  # the gpu role
    "control",  # the control role: beat's periodic maintenance
    "predictor",  # the load predictor (TensorFlow only inside its training and serving code)
]

MIDDLEWARE = [
    "webapp.middleware.ApiBodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into its 429 answer
]

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # refuses locked-out logins before a password is checked
    "django.contrib.auth.backends.ModelBackend",
]
# Repeated failed logins (the login page, the admin, HTTP basic on the API) lock that username
# from that source for a while. The lock is in the database, so it holds across processes and hosts.
AXES_FAILURE_LIMIT = env_int("CLOCKQ_LOGIN_FAILURE_LIMIT", 5, min_value=1, max_value=1000)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("CLOCKQ_LOGIN_LOCKOUT_MINUTES", 15, min_value=1, max_value=10_000))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# A source is the peer's address, but a job's uid for a connection from a job's program on this
# host, so that a job's failures never lock the admin out of the same address (clockq/login_source.py).
AXES_CLIENT_IP_CALLABLE = "clockq.login_source.axes_client_ip"
# Flower also counts failures per username and kind of source (another machine, this host, a
# job), against a guesser spread over many addresses or jobs. 20, four times the per-source limit:
# a user who mistypes from a few places stays far below it, and a spread guesser gets 20 guesses
# a lockout period instead of unbounded ones. A job's failures lock only jobs out.
CLOCKQ_FLOWER_USERNAME_FAILURE_LIMIT = env_int(
    "CLOCKQ_FLOWER_USERNAME_FAILURE_LIMIT", 20, min_value=1, max_value=100_000
)
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

ROOT_URLCONF = "clockq.urls"
WSGI_APPLICATION = "clockq.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------

_default_db_url = f"sqlite:///{VAR_DIR / 'clockq.sqlite3'}"
_db_url = env_or_file("DATABASE_URL") or _default_db_url
try:
    _db = dj_database_url.parse(_db_url, conn_max_age=60)
except Exception as exc:  # dj_database_url raises several types for a malformed URL
    raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from None
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Workers, beat and the web server share one file: WAL lets readers run beside a writer,
    # IMMEDIATE transactions take the write lock up front instead of failing on upgrade.
    _db["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests with worker processes need a file, not an in-memory database; one per test run, so
    # two runs in one checkout never share it (workers are given its path explicitly).
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-clockq-{os.getpid()}.sqlite3")}
    Path(_db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
elif _db["ENGINE"] == "django.db.backends.postgresql":
    if not _db.get("NAME"):
        raise ImproperlyConfigured("DATABASE_URL names no database: postgres://user:password@host:5432/<database>")
    _db["CONN_HEALTH_CHECKS"] = True
else:
    raise ImproperlyConfigured(f"DATABASE_URL: only sqlite and postgresql are supported, not {_db['ENGINE']}")
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every start without it
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # serve app static files without a collectstatic step
# The dashboard's charting library: the plotly wheel's own bundle, served from the installed
# package (static/plotly/plotly.min.js), so the page needs no internet and the repository holds
# no copy of it. Found without importing plotly.
_PLOTLY = importlib.util.find_spec("plotly")
if _PLOTLY is None or not _PLOTLY.submodule_search_locations:
    raise ImproperlyConfigured(
        "the plotly package is missing (the dashboard's charts): pip install -r requirements.txt"
    )
STATICFILES_DIRS = [("plotly", Path(_PLOTLY.submodule_search_locations[0]) / "package_data")]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "job-list"
LOGOUT_REDIRECT_URL = "login"

# The API takes JSON only, so a cross-site form post can never reach it, and at most this many
# bytes of it (413 beyond). Forms and the admin keep Django's own limit.
CLOCKQ_API_MAX_BODY_BYTES = env_int("CLOCKQ_API_MAX_BODY_BYTES", 256 * 1024, min_value=1024, max_value=64 * 2**20)
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 2**20
# A batch submit (`POST /api/jobs` with a JSON list) takes at most this many jobs, all or none.
# The body limit above still applies: 256 KiB holds 500 plain jobs (about 120 bytes each), not
# 500 with large params.
CLOCKQ_API_MAX_BATCH = env_int("CLOCKQ_API_MAX_BATCH", 500, min_value=1, max_value=10_000)
# HTTP basic auth on the API hashes a password on every request; it is off unless asked for, and
# then throttled per address. Tokens (`manage.py createtoken`, or the API tokens page) and the
# browser session are the documented ways in.
CLOCKQ_API_BASIC_AUTH = env_bool("CLOCKQ_API_BASIC_AUTH", False)
CLOCKQ_API_BASIC_AUTH_RATE = env_str("CLOCKQ_API_BASIC_AUTH_RATE") or "30/min"
if not re.fullmatch(r"[1-9][0-9]*/(s|sec|m|min|h|hour|d|day)", CLOCKQ_API_BASIC_AUTH_RATE):
    raise ImproperlyConfigured(
        f"CLOCKQ_API_BASIC_AUTH_RATE={CLOCKQ_API_BASIC_AUTH_RATE!r}: use requests per period, e.g. 30/min"
    )
# /metrics answers `Authorization: Bearer <this token>` (Prometheus) and staff sessions; unset,
# staff sessions only. Long enough that guessing it is hopeless.
CLOCKQ_METRICS_TOKEN = env_or_file("CLOCKQ_METRICS_TOKEN") or None
if CLOCKQ_METRICS_TOKEN is not None and not re.fullmatch(r"[\x21-\x7e]{24,}", CLOCKQ_METRICS_TOKEN):
    raise ImproperlyConfigured(
        "CLOCKQ_METRICS_TOKEN must be at least 24 printable ASCII characters without spaces, "
        "e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
    )
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first, so an unauthenticated call gets 401 with `WWW-Authenticate: Token`.
        "webapp.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "webapp.auth.OptionalBasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["webapp.parsers.BoundedJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "webapp.api_errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "clockq API",
    "DESCRIPTION": "Submit, follow and cancel GPU jobs. Authenticate with `Authorization: Token <token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
}
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=env_int("CLOCKQ_API_TOKEN_TTL_DAYS", 90, min_value=1, max_value=3650)),
    "AUTO_REFRESH": False,
}

CLOCKQ_LOG_LEVEL = env_choice("CLOCKQ_LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")).upper()
# Celery's per-task lines at DEBUG, /healthz's 503 at INFO, 500s with their traceback (clockq/logs.py).
LOGGING = logging_config(CLOCKQ_LOG_LEVEL)

# --- broker and Celery ----------------------------------------------------------------------

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
# --- clockq ---------------------------------------------------------------------------------

CLOCKQ_GPUS = parse_gpus(env_str("CLOCKQ_GPUS") or "auto")
# Memory of each simulated GPU in MiB, e.g. "16384,81920"; the last value repeats.
CLOCKQ_SIM_GPU_MEMORY_MIB = env_int_list("CLOCKQ_SIM_GPU_MEMORY_MIB", [16384], min_value=1, max_value=4 * 2**20)
_checkpoint_dir = env_or_file("CLOCKQ_CHECKPOINT_DIR")
if _checkpoint_dir is not None and not os.path.isabs(_checkpoint_dir):
    raise ImproperlyConfigured(
        f"CLOCKQ_CHECKPOINT_DIR={_checkpoint_dir!r} is not an absolute path; with several hosts it is the "
        "shared folder's mount point, the same on every host"
    )
CLOCKQ_CHECKPOINT_DIR = Path(_checkpoint_dir or VAR_DIR / "checkpoints")
# This host's name in the cluster: its workers are gpu<N>@<CLOCKQ_HOST>, control@<CLOCKQ_HOST>, ...
# Two hosts must not share one (a worker refuses to start while a live one holds its name).
CLOCKQ_HOST = (env_str("CLOCKQ_HOST") or "").strip() or socket.gethostname()
if _problem := host_name_problem(CLOCKQ_HOST):
    raise ImproperlyConfigured(f"CLOCKQ_HOST={CLOCKQ_HOST!r}: {_problem}")
# Exactly one beat sends the periodic tasks: it holds a lock in Redis for this long and renews
# it at each tick; a second beat waits, and takes over within this time when the first dies.
CLOCKQ_BEAT_LOCK_S = env_float("CLOCKQ_BEAT_LOCK_S", 15.0, min_value=2.0, max_value=600.0)
# Data that workloads prefetch ahead of their jobs (keras_train's datasets), shared by the jobs
# of a host. Prefetching runs in `gpuworkers` every CLOCKQ_PREFETCH_EVERY_S (0: never) while the
# control state has prefetch on, for the next CLOCKQ_PREFETCH_JOBS_PER_GPU queued jobs per GPU.
CLOCKQ_CACHE_DIR = Path(env_str("CLOCKQ_CACHE_DIR") or VAR_DIR / "cache")
# The cache's bounds (workers/data_cache.py): its key space is the users' (a dataset per seed),
# and it lies by default on the disk of the database and the broker's append-only file. It holds
# at most CLOCKQ_CACHE_MB, least recently used entries dropped first: 2 GiB holds seven of the
# largest datasets (4,000,000 examples, 272 MB), a few GPUs' jobs at that size and hundreds at
# common ones (a miss costs a rebuild, at most 8 s of CPU), and is small beside a disk that
# holds a database. It never leaves its disk with less than CLOCKQ_CACHE_RESERVE_PERCENT of its size free,
# and gives room back when something else fills the disk: 10 %, twice the checkpoint store's,
# because a Redis AOF rewrite or a SQLite checkpoint writes a second copy on this disk. A
# dataset the cache has no room for is built and kept in memory only. CLOCKQ_CACHE_MB=0: no cache.
CLOCKQ_CACHE_MB = env_int("CLOCKQ_CACHE_MB", 2048, min_value=0)
CLOCKQ_CACHE_RESERVE_PERCENT = env_float("CLOCKQ_CACHE_RESERVE_PERCENT", 10.0, min_value=0.0, max_value=90.0)
CLOCKQ_PREFETCH_EVERY_S = env_int("CLOCKQ_PREFETCH_EVERY_S", 30, min_value=0, max_value=3600)
CLOCKQ_PREFETCH_JOBS_PER_GPU = env_int("CLOCKQ_PREFETCH_JOBS_PER_GPU", 2, min_value=1, max_value=100)
PORT = env_int("PORT", 8000, min_value=1, max_value=65535)
FLOWER_PORT = env_int("FLOWER_PORT", 5555, min_value=1, max_value=65535)
CLOCKQ_ADMIN_PASSWORD = env_or_file("CLOCKQ_ADMIN_PASSWORD")

# A workload that raises is rolled back to its last checkpoint and retried this many times.
CLOCKQ_MAX_RETRIES = env_int("CLOCKQ_MAX_RETRIES", 3, min_value=0, max_value=100)
# A job that keeps running in continued slices still checkpoints this often, so a crash or a
# failing step loses at most this much work.
CLOCKQ_CHECKPOINT_EVERY_S = env_float("CLOCKQ_CHECKPOINT_EVERY_S", 60.0, min_value=0.0, max_value=86400.0)
# A queued job whose message has been missing from the broker this long is dispatched again.
CLOCKQ_REDISPATCH_GRACE_S = env_float("CLOCKQ_REDISPATCH_GRACE_S", 10.0, min_value=0.0, max_value=3600.0)
CLOCKQ_RT_LANE = env_choice("CLOCKQ_RT_LANE", "on", ("on", "off")) == "on"  # workers/rt_lane.py
CLOCKQ_PAUSE_MAX_S = env_float("CLOCKQ_PAUSE_MAX_S", 2.0, min_value=0.05, max_value=3600.0)  # then a checkpoint
# Where each RT lane holds its life lock, an flock its GPU's main worker takes the instant the
# lane dies, to take its RT job back at once (workers/lane_life.py). It must be on this host's
# own disk: var/ is, for the single-host setup; with var/ on a network mount, name a local one.
CLOCKQ_LANE_LOCK_DIR = Path(env_str("CLOCKQ_LANE_LOCK_DIR") or VAR_DIR / "lanes")
# A running job's lease: renewed every quarter of it by its worker; past it, the reaper takes
# the job back. It must outlast a stalled database write, not a step: renewal runs in a thread.
CLOCKQ_LEASE_S = env_float("CLOCKQ_LEASE_S", 20.0, min_value=1.0, max_value=3600.0)
# Slices are never so short that switching costs more than this share of the GPU.
CLOCKQ_OVERHEAD_BUDGET = env_float("CLOCKQ_OVERHEAD_BUDGET", 0.05, min_value=0.0, max_value=1.0)
CLOCKQ_MAX_SLICE_MS = env_int("CLOCKQ_MAX_SLICE_MS", 5000, min_value=1, max_value=3_600_000)
# The service ladder (clockq/policy/ordering.py): the attained GPU-seconds at which a job of the
# least urgent tier drops a level in the order; more urgent tiers stretch it. Increasing.
CLOCKQ_SERVICE_LADDER_S = env_float_list(
    "CLOCKQ_SERVICE_LADDER_S", list(BASE_LADDER_GPU_S), min_value=0.001, max_value=1e12
)
try:
    Ladder(base_gpu_s=tuple(CLOCKQ_SERVICE_LADDER_S))
except ValueError as exc:
    raise ImproperlyConfigured(f"CLOCKQ_SERVICE_LADDER_S={CLOCKQ_SERVICE_LADDER_S}: {exc}") from None
# Snapshot, then persist: a checkpoint is copied into host memory (the snapshot) and the GPU goes
# to the next job; a background thread writes it. Snapshots in flight hold at most this much host
# memory per worker; past it, the next checkpoint is written before the GPU is handed over.
CLOCKQ_SNAPSHOT_MEMORY_MB = env_int("CLOCKQ_SNAPSHOT_MEMORY_MB", 1024, min_value=0)
# A worker that claims a job whose newest checkpoint is still being written elsewhere waits this
# long for it, then falls back to the generation before it (the writer died, or is very slow).
CLOCKQ_PERSIST_WAIT_S = env_float("CLOCKQ_PERSIST_WAIT_S", 30.0, min_value=0.0, max_value=3600.0)
# Warm resume: live workloads a worker keeps after yielding them, bounded by count and state size.
CLOCKQ_WARM_CACHE_JOBS = env_int("CLOCKQ_WARM_CACHE_JOBS", 2, min_value=0, max_value=64)
CLOCKQ_WARM_CACHE_MB = env_int("CLOCKQ_WARM_CACHE_MB", 512, min_value=0)
# Placement affinity (clockq/policy/affinity.py): how long a free GPU leaves a job yielded on
# another worker, which holds it warm and is busy, to that worker. 0 turns it off.
CLOCKQ_WARM_WAIT_S = env_float("CLOCKQ_WARM_WAIT_S", _affinity.WARM_WAIT_S, min_value=0.0, max_value=10.0)
# Per-user limits, unless the admin sets other ones for a user (Quotas): jobs queued, running or
# held at once, and checkpoint storage (what finished jobs keep counts until retention ends).
CLOCKQ_QUOTA_ACTIVE_JOBS = env_int("CLOCKQ_QUOTA_ACTIVE_JOBS", 500, min_value=1)
CLOCKQ_QUOTA_CHECKPOINT_MB = env_int("CLOCKQ_QUOTA_CHECKPOINT_MB", 20 * 1024, min_value=1)
# Files (inodes) a user's jobs may hold in their work folders at once: a store's inodes run out
# long before its bytes do when a program makes small files (300,000 of them fill a 1 GiB tmpfs).
CLOCKQ_QUOTA_FILES = env_int("CLOCKQ_QUOTA_FILES", 1_000_000, min_value=1)
# What one job may hold on the checkpoint store (its checkpoints, its work folder, logs included,
# and its result), whatever its owner's quota leaves: one job of a user cannot take all of it.
CLOCKQ_JOB_STORAGE_MB = env_int("CLOCKQ_JOB_STORAGE_MB", 10 * 1024, min_value=1)
CLOCKQ_JOB_FILES = env_int("CLOCKQ_JOB_FILES", 100_000, min_value=1)
# Room on the checkpoint store that no job's work folder may take: the checkpoints and results of
# every other job are written there, so a store one job fills stalls every GPU. A share of the
# store's size, so that it means the same on a 1 GiB tmpfs and on a 10 TB volume.
CLOCKQ_STORE_RESERVE_PERCENT = env_float("CLOCKQ_STORE_RESERVE_PERCENT", 5.0, min_value=0.0, max_value=90.0)
# A storage fault that follows one job from claim to claim, while the store takes other writes
# (a small synced probe right after the fault), is the job's after this many: the job fails.
CLOCKQ_JOB_STORAGE_FAULTS = env_int("CLOCKQ_JOB_STORAGE_FAULTS", 3, min_value=1, max_value=100)
# How much of a command program's stdout and of its stderr the worker keeps (the end of each),
# in the work folder's stdout.log and stderr.log: a program's output goes through the worker,
# never straight to a file on the store.
CLOCKQ_COMMAND_LOG_KEEP_KB = env_int("CLOCKQ_COMMAND_LOG_KEEP_KB", 2048, min_value=4, max_value=1024 * 1024)
# Checkpoints of finished jobs are deleted this long after they finish.
CLOCKQ_CHECKPOINT_RETENTION_S = env_int("CLOCKQ_CHECKPOINT_RETENTION_S", 86_400, min_value=0)
# Results (what a succeeded job produced) are deleted this long after the job finished; 0 keeps
# them until someone deletes the job's folder. They count toward the owner's storage quota.
CLOCKQ_RESULT_RETENTION_S = env_int("CLOCKQ_RESULT_RETENTION_S", 0, min_value=0)
# KPIs (/api/kpis): the price of one GPU-hour, busy or idle, for the cost per useful GPU-hour;
# and how long the per-minute rollup rows are kept.
CLOCKQ_GPU_HOUR_PRICE = env_float("CLOCKQ_GPU_HOUR_PRICE", 2.5, min_value=0.0, max_value=1_000_000.0)
CLOCKQ_KPI_RETENTION_DAYS = env_int("CLOCKQ_KPI_RETENTION_DAYS", 90, min_value=1, max_value=3650)
# GPU telemetry sampling interval while a slice runs.
CLOCKQ_SAMPLE_EVERY_S = env_float("CLOCKQ_SAMPLE_EVERY_S", 0.01, min_value=0.001, max_value=10.0)
# Load control (clockq/policy/control.py): admission closes when the forecast load index passes
# CLOSE_ABOVE and reopens only below REOPEN_BELOW (the gap keeps it from flapping); while it is
# closed, HOLDS says which new jobs are held: "when-full", only a job that would wait anyway (no
# GPU free, and more urgent new work already queued for every GPU), or "all", every new job but
# RT until it reopens (the specification's literal pause, which costs completion time: see
# docs/predictor.md). Scale-out never asks for more than CLOCKQ_MAX_GPU_WORKERS GPU workers.
CLOCKQ_ADMISSION_CLOSE_ABOVE = env_float(
    "CLOCKQ_ADMISSION_CLOSE_ABOVE", _control.CLOSE_ABOVE, min_value=0.01, max_value=_control.MAX_FORECAST
)
CLOCKQ_ADMISSION_REOPEN_BELOW = env_float(
    "CLOCKQ_ADMISSION_REOPEN_BELOW", _control.REOPEN_BELOW, min_value=0.01, max_value=_control.MAX_FORECAST
)
CLOCKQ_ADMISSION_HOLDS = env_choice("CLOCKQ_ADMISSION_HOLDS", _control.HOLD_WHEN_FULL, _control.HOLD_MODES)
CLOCKQ_MAX_GPU_WORKERS = env_int("CLOCKQ_MAX_GPU_WORKERS", _control.MAX_WORKERS, min_value=1, max_value=100_000)
# Admission acts on a persistence forecast (what the predictor serves until a model beats it) only
# once this many load samples are kept; before that it stays open. A model's forecast acts at once.
CLOCKQ_ADMISSION_WARMUP_SAMPLES = env_int(
    "CLOCKQ_ADMISSION_WARMUP_SAMPLES", _control.WARMUP_SAMPLES, min_value=0, max_value=1_000_000
)
if _problems := _control.threshold_problems(
    _control.Thresholds(
        close_above=CLOCKQ_ADMISSION_CLOSE_ABOVE,
        reopen_below=CLOCKQ_ADMISSION_REOPEN_BELOW,
        max_workers=CLOCKQ_MAX_GPU_WORKERS,
        hold=CLOCKQ_ADMISSION_HOLDS,
        warmup_samples=CLOCKQ_ADMISSION_WARMUP_SAMPLES,
    )
):
    raise ImproperlyConfigured("CLOCKQ_ADMISSION_*: " + " ".join(p.message for p in _problems))

# Load history (clockq/forecasting/load_history.py): the "clockq: load sample" periodic task is created
# with this interval (afterwards the admin's Periodic tasks page changes it), and samples are
# kept this many days (the predictor trains on 30).
CLOCKQ_LOAD_SAMPLE_EVERY_S = env_int("CLOCKQ_LOAD_SAMPLE_EVERY_S", 60, min_value=15, max_value=3600)
CLOCKQ_LOAD_HISTORY_DAYS = env_int("CLOCKQ_LOAD_HISTORY_DAYS", 35, min_value=1, max_value=3650)
# The live predictor (predictor/tasks.py, on the predictor queue): "clockq: forecast" is created
# to run every CLOCKQ_FORECAST_EVERY_S (never slower than every 5 minutes: a forecast older than
# that is stale in /healthz), "clockq: train predictor" every CLOCKQ_TRAIN_EVERY_S. Training
# waits for CLOCKQ_PREDICTOR_MIN_SAMPLES load samples (and at least what its time-ordered split
# needs); until then the forecast is persistence and says so. Models are saved under
# CLOCKQ_MODEL_DIR. The LSTM's training stops after about CLOCKQ_TRAIN_BUDGET_S seconds.
CLOCKQ_FORECAST_EVERY_S = env_int("CLOCKQ_FORECAST_EVERY_S", 60, min_value=10, max_value=300)
CLOCKQ_TRAIN_EVERY_S = env_int("CLOCKQ_TRAIN_EVERY_S", 3600, min_value=300, max_value=7 * 86_400)
CLOCKQ_PREDICTOR_MIN_SAMPLES = env_int("CLOCKQ_PREDICTOR_MIN_SAMPLES", 300, min_value=50, max_value=1_000_000)
CLOCKQ_PREDICTOR_HISTORY_DAYS = env_int("CLOCKQ_PREDICTOR_HISTORY_DAYS", 30, min_value=1, max_value=3650)
CLOCKQ_TRAIN_BUDGET_S = env_float("CLOCKQ_TRAIN_BUDGET_S", 50.0, min_value=1.0, max_value=3600.0)
CLOCKQ_MODEL_DIR = Path(env_str("CLOCKQ_MODEL_DIR") or VAR_DIR / "models")

# Scale-out hook, for operators without Kubernetes: when the desired GPU worker count changes, an
# http(s):// URL gets a JSON POST, anything else is a command (split like a shell would, run
# without one) that reads the JSON on stdin. Staff configure it; it runs with clockq's rights.
CLOCKQ_SCALE_HOOK = (env_str("CLOCKQ_SCALE_HOOK") or "").strip() or None
if CLOCKQ_SCALE_HOOK is not None:
    try:
        parse_scale_hook(CLOCKQ_SCALE_HOOK)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"CLOCKQ_SCALE_HOOK: {_exc}") from None

# The `command` workload runs a user's program in a bubblewrap sandbox (workers/sandbox.py),
# as a uid of its own from this range (workers running as root), with these limits; 0 means no
# limit. CLOCKQ_COMMAND_SANDBOX=none runs programs unsandboxed: unsafe, for a machine whose
# every user is trusted.
CLOCKQ_COMMAND_SANDBOX = env_choice("CLOCKQ_COMMAND_SANDBOX", "bwrap", ("bwrap", "none"))
# A program's network (workers/program_network.py): a namespace of its own, connected outwards by
# slirp4netns with no way to the host's loopback (private, the default: on the host's network a
# job reaches the web server, Flower, Redis and PostgreSQL on 127.0.0.1); none: loopback only;
# host: the host's network (unsafe).
CLOCKQ_COMMAND_NETWORK = env_choice("CLOCKQ_COMMAND_NETWORK", "private", ("private", "none", "host"))
CLOCKQ_COMMAND_UID_BASE = env_int("CLOCKQ_COMMAND_UID_BASE", 1_000_000_000, min_value=1, max_value=2**32 - 2)
CLOCKQ_COMMAND_UID_COUNT = env_int(
    "CLOCKQ_COMMAND_UID_COUNT", 1_000_000_000, min_value=1, max_value=2**32 - 1 - CLOCKQ_COMMAND_UID_BASE
)
# Folders a program may read although they lie in a folder it does not see (/tmp, clockq's code).
CLOCKQ_COMMAND_READ_PATHS = env_list("CLOCKQ_COMMAND_READ_PATHS", [])
for _path in CLOCKQ_COMMAND_READ_PATHS:
    if not os.path.isabs(_path):
        raise ImproperlyConfigured(f"CLOCKQ_COMMAND_READ_PATHS: {_path!r} is not an absolute path")
CLOCKQ_ALLOW_SAME_USER_COMMANDS = env_bool("CLOCKQ_ALLOW_SAME_USER_COMMANDS", False)
CLOCKQ_COMMAND_MAX_PROCESSES = env_int("CLOCKQ_COMMAND_MAX_PROCESSES", 1024, min_value=0, max_value=1_048_576)
CLOCKQ_COMMAND_CPU_S = env_int("CLOCKQ_COMMAND_CPU_S", 7 * 86_400, min_value=0)
# A program's memory, swap included (workers/memory_bound.py). Unset: this host's share per GPU,
# (MemTotal - CLOCKQ_COMMAND_MEMORY_RESERVE_MB - each GPU worker's own) / GPUs, what a GPU's part
# of the host is, as on a cloud GPU instance, so that one job cannot starve the others' programs
# and the workers; 0: no limit (unsafe: one program can take the host's memory).
CLOCKQ_COMMAND_MEMORY_MB = (
    env_int("CLOCKQ_COMMAND_MEMORY_MB", 0, min_value=0) if (env_str("CLOCKQ_COMMAND_MEMORY_MB") or "").strip() else None
)
# Host memory kept out of the shares: the kernel and system services, and clockq's roles that run
# beside the GPU workers on one host (web, beat, control, Flower, Redis, the predictor's
# TensorFlow at about 520 MiB).
CLOCKQ_COMMAND_MEMORY_RESERVE_MB = env_int("CLOCKQ_COMMAND_MEMORY_RESERVE_MB", 4096, min_value=0)
# How the limit is held: a cgroup of the program's own where the host lets the worker make one,
# else the worker's watchdog (auto); cgroup refuses command jobs where no cgroup can be made;
# watchdog never uses one. RLIMIT_AS is never used: CUDA reserves far more address space than it
# uses. CLOCKQ_COMMAND_CGROUP: the folder the programs' cgroups are made in (auto: the worker's
# own memory cgroup on cgroup v1, or its own cgroup v2 where that may have children with memory).
CLOCKQ_COMMAND_MEMORY_ENFORCE = env_choice("CLOCKQ_COMMAND_MEMORY_ENFORCE", "auto", ("auto", "cgroup", "watchdog"))
CLOCKQ_COMMAND_CGROUP = (env_str("CLOCKQ_COMMAND_CGROUP") or "").strip() or "auto"
if CLOCKQ_COMMAND_CGROUP != "auto" and not os.path.isabs(CLOCKQ_COMMAND_CGROUP):
    raise ImproperlyConfigured(f"CLOCKQ_COMMAND_CGROUP={CLOCKQ_COMMAND_CGROUP!r} is neither auto nor an absolute path")
# How often the worker looks at a running program's memory: its cgroup's OOM kills, or the
# watchdog's sum. A look at the cgroup reads one small file; the watchdog's reads the status of the
# sandbox's processes (under 1 ms for a few; without a sandbox, of every process: 20 ms for 330),
# and a program may pass its limit by what it allocates between two looks.
CLOCKQ_COMMAND_MEMORY_WATCH_MS = env_int("CLOCKQ_COMMAND_MEMORY_WATCH_MS", 100, min_value=10, max_value=10_000)
CLOCKQ_COMMAND_MAX_FILES = env_int("CLOCKQ_COMMAND_MAX_FILES", 4096, min_value=0, max_value=1_048_576)
CLOCKQ_COMMAND_MAX_FILE_MB = env_int("CLOCKQ_COMMAND_MAX_FILE_MB", 50 * 1024, min_value=0)

CLOCKQ_WORKLOADS = {
    "synthetic": "workers.workloads.synthetic.SyntheticWorkload",
    "matmul": "workers.workloads.matmul.MatmulWorkload",
    "keras_train": "workers.workloads.keras_train.KerasTrainWorkload",
    "command": "workers.workloads.command.CommandWorkload",
}
