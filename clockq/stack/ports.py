"""The ports `make run` needs, checked before anything is installed or migrated.

`make run` runs this file with the system's python3 before it creates the virtual environment
(`python3 clockq/stack/ports.py`), so it imports nothing but the standard library, and it reads
the same variables as clockq/settings.py: PORT (the web, 8000), FLOWER_PORT (5555), CLOCKQ_BIND,
CLOCKQ_VAR_DIR, and for the embedded Redis CLOCKQ_EMBEDDED_REDIS_PORT (6390) unless REDIS_URL or
REDIS_URL_FILE names a broker.

- The web's and Flower's ports must be free: a taken one stops the start at once, saying which
  port, what holds it when this user may see that, and the variable that chooses another.
- The embedded Redis's port is picked: the one recorded in `var/redis.url`, else 6390; when it is
  taken, the next free one, recorded there (clockq/embedded_redis.py). settings.py reads that
  file, so `manage.py`, Celery's CLI (`celery -A clockq ...`, through the app's config) and the
  benchmarks find the broker without a variable. An explicit CLOCKQ_EMBEDDED_REDIS_PORT is never
  moved: taken, it stops the start like the other two. REDIS_URL wins over all of this.
"""

from __future__ import annotations

import os
import pwd
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__:
    from clockq import embedded_redis
else:  # run as a script by `make run`: the clockq package (its __init__ loads Celery) is not importable,
    # so the one core module this needs, itself standard library only, is loaded by its path.
    import importlib.util

    _spec = importlib.util.spec_from_file_location("embedded_redis", Path(__file__).parents[1] / "embedded_redis.py")
    assert _spec is not None and _spec.loader is not None
    embedded_redis = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(embedded_redis)

DEFAULT_WEB_PORT = 8000
DEFAULT_FLOWER_PORT = 5555
# Ports tried after a taken embedded Redis port, before the system picks any free one.
PICK_RANGE = 100
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `host`:`port` now (a socket in TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def who_listens(port: int, proc: Path = Path("/proc")) -> str | None:
    """What listens on TCP `port`, as far as this user may see: 'pid 123 (redis-server ...)',
    'a process of user bob', or None when nothing is found (no /proc, or not a TCP listener)."""
    pid, uid = _listener(port, proc)
    if pid is not None:
        return f"pid {pid} ({_command_line(proc / str(pid))})"
    return None if uid is None else f"a process of user {_user_name(uid)}"


def _listener(port: int, proc: Path = Path("/proc")) -> tuple[int | None, int | None]:
    """The pid of what listens on TCP `port` where this user may see it, and its user's id;
    (None, None) when nothing is found."""
    owners: dict[str, int] = {}  # socket inode: uid
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                owners[cols[9]] = int(cols[7])
    if not owners:
        return None, None
    wanted = {f"socket:[{inode}]" for inode in owners}
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (pid_dir / "fd").iterdir()}
        except OSError:
            continue  # another user's process, or one that just ended
        if links & wanted:
            return int(pid_dir.name), next(iter(owners.values()))
    return None, next(iter(owners.values()))


def _keeps_files_in(pid: int, folder: Path, proc: Path = Path("/proc")) -> bool:
    """Whether process `pid` works in `folder` or below it: redis-server changes into its
    `--dir` (<var>/redis for the embedded one) and rewrites its command line, so its working
    directory is what tells."""
    try:
        cwd = Path(os.readlink(proc / str(pid) / "cwd"))
    except OSError:
        return False  # another user's process, or one that just ended
    root = folder.resolve()
    return cwd == root or root in cwd.parents


def _command_line(pid_dir: Path) -> str:
    try:
        raw = (pid_dir / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = " ".join(" ".join(part.decode(errors="replace") for part in raw.split(b"\0")).split())
    return text if len(text) <= 120 else text[:117] + "..."


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def pick_free_port(start: int, host: str = "127.0.0.1") -> int:
    """The first free port after `start` (within PICK_RANGE), else one the system picks."""
    for port in range(start + 1, min(start + 1 + PICK_RANGE, 65536)):
        if port_is_free(port, host):
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Ports:
    """What the check found: problems stop the start; notes say what was chosen."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    redis_port: int | None = None  # the embedded Redis's, None with REDIS_URL


def _int_variable(env: dict[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"{name}={raw!r} is not a port number (1 to 65535)")
    return int(raw)


def _taken(name: str, port: int, what: str, hint: str) -> str:
    holder = who_listens(port)
    by = f" by {holder}" if holder else ""
    return f"{name}={port} ({what}) is taken{by}; {hint}"


def check_ports(
    env: dict[str, str], var_dir: Path, *, pick: bool = True, roles: tuple[str, ...] | None = None
) -> Ports:
    """Check the ports of `make run` (`roles`: a subset of web, flower, redis; all by default).
    With `pick`, a taken embedded Redis port that no variable fixed is replaced by a free one,
    recorded in var/redis.url; without it, that is a problem too. ValueError for a variable
    that is not a port."""
    wanted = set(("web", "flower", "redis") if roles is None else roles)
    host = (env.get("CLOCKQ_BIND") or "127.0.0.1").strip()
    found = Ports()
    for role, name, default, what in (
        ("web", "PORT", DEFAULT_WEB_PORT, "the web server"),
        ("flower", "FLOWER_PORT", DEFAULT_FLOWER_PORT, "Flower"),
    ):
        port = _int_variable(env, name, default)
        if role in wanted and not port_is_free(port, host):
            free = pick_free_port(port, host)
            found.problems.append(_taken(name, port, what, f"choose another, e.g. {name}={free} make run"))
    if "redis" in wanted and not (env.get("REDIS_URL") or env.get("REDIS_URL_FILE") or "").strip():
        _check_redis(env, var_dir, found, pick=pick and not found.problems)
    return found


def _check_redis(env: dict[str, str], var_dir: Path, found: Ports, *, pick: bool) -> None:
    name = "CLOCKQ_EMBEDDED_REDIS_PORT"
    explicit = bool((env.get(name) or "").strip())
    port = _int_variable(env, name, embedded_redis.DEFAULT_REDIS_PORT) if explicit else None
    source = name
    if port is None:
        port = embedded_redis.recorded_port(var_dir)
        source = str(embedded_redis.record_path(var_dir)) if port is not None else "the default"
        port = port or embedded_redis.DEFAULT_REDIS_PORT
    found.redis_port = port
    if port_is_free(port):
        return
    if explicit or not pick:
        hint = (
            f"choose another with {name}=..., unset {name} to let `make run` pick a free one, "
            "or set REDIS_URL to a Redis of your own"
        )
        if not explicit:
            hint = f"`make run` picks a free one and records it in {embedded_redis.record_path(var_dir)}; or {hint}"
        found.problems.append(_taken(name, port, "the embedded Redis", hint))
        return
    pid, _uid = _listener(port)
    if pid is not None and _keeps_files_in(pid, var_dir):
        # An earlier start's Redis outlived it: a second one on the same append-only file would
        # corrupt it, so this is not a port to move off but a process to stop.
        found.problems.append(
            f"port {port} for the embedded Redis is taken by the embedded Redis of an earlier start of this "
            f"clockq, still running (pid {pid}, its files in {var_dir}); stop it (kill {pid}) and start again"
        )
        return
    holder = who_listens(port)
    free = pick_free_port(port)
    embedded_redis.record_port(var_dir, free)
    found.redis_port = free
    record = embedded_redis.record_path(var_dir)
    found.notes.append(
        f"port {port} for the embedded Redis ({source}) is taken{f' by {holder}' if holder else ''}: "
        f"using {free}, recorded in {record} (manage.py and `celery -A clockq` read it there; "
        f"{name} or REDIS_URL choose otherwise)"
    )


def default_var_dir(env: dict[str, str]) -> Path:
    """CLOCKQ_VAR_DIR, else var/ in this checkout (as settings.py has it)."""
    return Path(env.get("CLOCKQ_VAR_DIR") or Path(__file__).resolve().parents[2] / "var")


def main() -> int:
    env = dict(os.environ)
    try:
        found = check_ports(env, default_var_dir(env))
    except ValueError as exc:
        print(f"clockq cannot start: {exc}", file=sys.stderr)
        return 2
    for note in found.notes:
        print(f"clockq: {note}")
    if found.problems:
        print("clockq cannot start: a port it needs is taken.", file=sys.stderr)
        for problem in found.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
