"""Where a clockq process keeps its files, and who may read them: read first, as every other part
writes under var/."""

from __future__ import annotations

import os
from pathlib import Path

from clockq.env import env_str

BASE_DIR = Path(__file__).resolve().parents[2]
# Every file a clockq process makes (the SQLite database, secrets, checkpoints, logs) is its own:
# other users, the uids that run jobs' programs among them, cannot read it.
os.umask(0o077)
VAR_DIR = Path(env_str("CLOCKQ_VAR_DIR") or BASE_DIR / "var")
