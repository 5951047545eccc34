"""Proof that hosts share one checkpoint folder: the web role writes a token into
CLOCKQ_CHECKPOINT_DIR and records it in the database; a host whose folder holds another token,
or none, is not looking at the same storage, and its jobs' checkpoints would be lost to the rest
of the cluster."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from clockq.fleet.models import CheckpointMarker

MARKER_NAME = ".clockq-shared-folder"


def _read(folder: Path) -> str | None:
    try:
        return (folder / MARKER_NAME).read_text().strip() or None
    except FileNotFoundError:
        return None


def write_marker(folder: Path, host: str) -> str:
    """The web role's part: keep the folder's token if it has one, else write a new one
    (atomically), and record it as the cluster's. Returns the token."""
    folder.mkdir(parents=True, exist_ok=True)
    token = _read(folder)
    if token is None:
        token = secrets.token_hex(16)
        tmp = folder / f"{MARKER_NAME}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(token + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        # Readable by every host's clockq user, whatever uid it runs as; it holds no secret.
        tmp.chmod(0o644)
        os.replace(tmp, folder / MARKER_NAME)
    CheckpointMarker.objects.update_or_create(
        pk=CheckpointMarker.SINGLETON, defaults={"token": token, "written_by": host}
    )
    return token


def recorded() -> CheckpointMarker | None:
    return CheckpointMarker.objects.filter(pk=CheckpointMarker.SINGLETON).first()


def marker_problem(folder: Path) -> str | None:
    """Why this host's `folder` is not the cluster's checkpoint folder, or None when it is (or
    when no web role has recorded a marker yet: the caller waits for one)."""
    marker = recorded()
    if marker is None:
        return None
    try:
        token = _read(folder)
    except OSError as exc:
        return f"CLOCKQ_CHECKPOINT_DIR={folder} cannot be read on this host ({exc.strerror or exc})"
    if token is None:
        return (
            f"CLOCKQ_CHECKPOINT_DIR={folder} holds no {MARKER_NAME} file, which the web role on "
            f"{marker.written_by} wrote into its checkpoint folder: this host does not see the shared "
            "storage (is it mounted here, at the same path?)"
        )
    if token != marker.token:
        return (
            f"CLOCKQ_CHECKPOINT_DIR={folder} holds another {MARKER_NAME} than the one the web role on "
            f"{marker.written_by} wrote: this host sees another folder than the web role does"
        )
    return None
