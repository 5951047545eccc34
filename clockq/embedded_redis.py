"""The embedded Redis's port, as `make run` records it: written by the launcher's port check
(clockq/stack/ports.py) when 6390 is taken, read by the settings (EMBEDDED_REDIS_PORT), so that
`manage.py`, `celery -A clockq` and the benchmarks find the broker without a variable.

It is the core's, not the launcher's, because both use it and the settings may import nothing
of the launcher. Standard library only: the port check runs with the system's python3 before
the virtual environment exists, and loads this file by its path.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_REDIS_PORT = 6390
RECORD_NAME = "redis.url"


def record_path(var_dir: Path) -> Path:
    return var_dir / RECORD_NAME


def recorded_port(var_dir: Path) -> int | None:
    """The embedded Redis's port recorded in var/redis.url, or None when there is no record.
    ValueError saying what is wrong when the file is not such a URL."""
    path = record_path(var_dir)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        port = None
    if not text.startswith("redis://") or port is None:
        raise ValueError(f"{path} should hold redis://127.0.0.1:PORT/0, not {text[:80]!r}; delete it to pick again")
    return port


def record_port(var_dir: Path, port: int) -> Path:
    """Write var/redis.url (0600, replaced atomically) for the embedded Redis on `port`."""
    var_dir.mkdir(parents=True, exist_ok=True)
    path = record_path(var_dir)
    tmp = path.with_name(f".{RECORD_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"redis://127.0.0.1:{port}/0\n")
    os.replace(tmp, path)
    return path
