"""Durable files on a local disk, for the core and the GPU worker alike (it imports nothing of
clockq's, so any layer may use it)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Put the directory's entries on disk: a file renamed into it (or created, or deleted) is
    durable only once its directory entry is."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
