"""The Django project: its secret and cookies, hosts, apps, middleware, templates, static files,
language and time zone, and what its processes log."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from clockq.config.paths import VAR_DIR
from clockq.env import env_bool, env_choice, env_list, env_or_file, persistent_secret
from clockq.logs import logging_config

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

CLOCKQ_LOG_LEVEL = env_choice("CLOCKQ_LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")).upper()
# Celery's per-task lines at DEBUG, /healthz's 503 at INFO, 500s with their traceback (clockq/logs.py).
LOGGING = logging_config(CLOCKQ_LOG_LEVEL)
