"""Small helpers that read settings from the environment and reject bad values loudly."""

from __future__ import annotations

import os
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from clockq import embedded_redis

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def env_or_file(name: str) -> str | None:
    """`name` from the environment, or the content of the file named by `name`_FILE (as Docker
    and Kubernetes secrets are mounted), without its trailing newline; None when neither is
    set. Both set, an unreadable or an empty file raise ImproperlyConfigured naming the
    variable, never the value."""
    file_var = f"{name}_FILE"
    value, path = os.environ.get(name), os.environ.get(file_var)
    if path is None or path.strip() == "":
        return value if value is None or value.strip() else None
    if value is not None and value.strip():
        raise ImproperlyConfigured(f"both {name} and {file_var} are set; set one of them")
    try:
        content = Path(path).read_text().rstrip("\r\n")
    except UnicodeDecodeError:
        raise ImproperlyConfigured(f"{file_var}={path!r}: the file is not UTF-8 text") from None
    except OSError as exc:
        raise ImproperlyConfigured(f"{file_var}={path!r}: cannot read it: {exc.strerror or exc}") from None
    if not content.strip():
        raise ImproperlyConfigured(f"{file_var}={path!r}: the file is empty")
    if "\n" in content:
        raise ImproperlyConfigured(f"{file_var}={path!r}: the file holds more than one line")
    return content


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return value


def env_int(name: str, default: int, *, min_value: int | None = None, max_value: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if min_value is not None and value < min_value:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {min_value}")
    if max_value is not None and value > max_value:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum {max_value}")
    return value


def env_float(name: str, default: float, *, min_value: float, max_value: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not (min_value <= value <= max_value):
        raise ImproperlyConfigured(f"{name}={value} is outside [{min_value}, {max_value}]")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int_list(name: str, default: list[int], *, min_value: int, max_value: int) -> list[int]:
    return _env_list(name, default, int, "integers", min_value, max_value)


def env_float_list(name: str, default: list[float], *, min_value: float, max_value: float) -> list[float]:
    return _env_list(name, default, float, "numbers", min_value, max_value)


def _env_list(name, default, parse, kind: str, min_value, max_value):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        values = [parse(part) for part in raw.split(",")]
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a comma list of {kind}") from None
    if any(not min_value <= v <= max_value for v in values):
        raise ImproperlyConfigured(f"{name}={raw!r}: each value must be between {min_value} and {max_value}")
    return values


def parse_gpus(raw: str) -> str | list[int]:
    """`auto`, `sim:N` or a comma list of GPU indices such as `0,1,3`.

    Returns "auto", "sim:N" (normalised) or the list of indices.
    """
    value = raw.strip().lower()
    if value == "auto":
        return "auto"
    if value.startswith("sim:"):
        count = value[4:]
        if not count.isdigit() or not (1 <= int(count) <= 64):
            raise ImproperlyConfigured(f"CLOCKQ_GPUS={raw!r}: sim:N needs N between 1 and 64")
        return f"sim:{int(count)}"
    try:
        indices = [int(part) for part in value.split(",")]
    except ValueError:
        raise ImproperlyConfigured(
            f"CLOCKQ_GPUS={raw!r}: use auto, sim:N or a comma list of GPU indices like 0,1,3"
        ) from None
    if any(i < 0 or i > 255 for i in indices) or len(set(indices)) != len(indices):
        raise ImproperlyConfigured(f"CLOCKQ_GPUS={raw!r}: indices must be distinct and in 0..255")
    return indices


@dataclass(frozen=True)
class ScaleHook:
    """CLOCKQ_SCALE_HOOK parsed: a webhook URL, or a command's argv (run without a shell)."""

    url: str | None = None
    argv: tuple[str, ...] = ()

    def describe(self) -> str:
        """For logs: the URL without its path, query or credentials (a webhook's path often holds
        its secret), or the program's name."""
        if self.url is not None:
            parts = urlsplit(self.url)
            return f"POST {parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}/..."
        return f"command {self.argv[0]}"


def parse_scale_hook(raw: str) -> ScaleHook:
    """An http:// or https:// URL, or a command line split like a shell would (quotes work; no
    pipes, redirections or variables: there is no shell). Raises ValueError saying what is wrong."""
    value = raw.strip()
    if not value:
        raise ValueError("empty")
    if value.lower().startswith(("http://", "https://")):
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a valid URL: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"{value!r} has no host")
        if any(c.isspace() for c in value):
            raise ValueError("a URL cannot contain spaces")
        return ScaleHook(url=value)
    if "://" in value.split()[0]:
        raise ValueError(f"{value!r}: only http:// and https:// URLs are supported; anything else is a command")
    try:
        argv = shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"cannot split the command {value!r}: {exc}") from None
    return ScaleHook(argv=tuple(argv))


def embedded_redis_port(var_dir: Path) -> int:
    """The embedded Redis's port when no variable sets it: the one `make run` recorded in
    var/redis.url because 6390 was taken (clockq/embedded_redis.py), else 6390."""
    try:
        return embedded_redis.recorded_port(var_dir) or embedded_redis.DEFAULT_REDIS_PORT
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def persistent_secret(path: Path, nbytes: int = 48) -> str:
    """A random secret kept in a 0600 file, so restarts keep sessions and passwords valid."""
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(nbytes)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        existing = path.read_text().strip()
        if not existing:
            raise ImproperlyConfigured(f"{path} is empty; delete it to generate a new secret") from None
        return existing
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return value


_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def host_name_problem(name: str) -> str | None:
    """Why `name` cannot name a host in worker names (gpu0@<name>), or None: letters, digits,
    dots, hyphens and underscores, up to 63, starting and ending with a letter or digit."""
    if not _HOST_NAME.fullmatch(name):
        return "use up to 63 letters, digits, '.', '-' or '_', starting and ending with a letter or digit"
    return None


def redis_url_problem(url: str) -> str | None:
    """Why `url` is not a usable broker URL, or None. Never repeats the URL: it may hold a password."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme not in ("redis", "rediss", "unix"):
        return "must start with redis://, rediss:// or unix://"
    if parts.scheme == "unix":
        return None if parts.path.startswith("/") else "a unix:// URL needs an absolute socket path"
    if not parts.hostname:
        return "names no host: redis://[:password@]host:6379/0"
    if port == 0:
        return "port 0 is not a port"
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        return f"the database number after the last '/' must be an integer, not {db!r}"
    return None
