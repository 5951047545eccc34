"""The database: DATABASE_URL, else SQLite under var/."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from clockq.config.paths import VAR_DIR
from clockq.env import env_or_file

_default_db_url = f"sqlite:///{VAR_DIR / 'clockq.sqlite3'}"
_db_url = env_or_file("DATABASE_URL") or _default_db_url
try:
    _db = dj_database_url.parse(_db_url, conn_max_age=60)
except Exception as _exc:  # dj_database_url raises several types for a malformed URL
    raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {_exc}") from None
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
