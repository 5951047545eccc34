"""`make run`'s first step: stop what an earlier start of this checkout left running (its
supervisor killed, and its undertaker too), before the ports are checked.

The records, and what a dead supervisor's record lets a start stop, are the supervisors'
(clockq/supervision/records.py); this is the launcher's use of them, for this checkout's var/.

Standard library only: `make run` runs this file with the system's python3 before the virtual
environment exists (`python3 clockq/stack/leftovers.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __package__:
    from clockq.supervision import records
else:  # run as a script by `make run`: the clockq package (its __init__ loads Celery) is not importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "supervision"))
    import records  # type: ignore[no-redef]


def default_var_dir(env: dict[str, str]) -> Path:
    """CLOCKQ_VAR_DIR, else var/ in this checkout (as settings.py has it)."""
    return Path(env.get("CLOCKQ_VAR_DIR") or Path(__file__).resolve().parents[2] / "var")


def main(argv: list[str]) -> int:
    """Stop what earlier starts of this checkout left running, and say what."""
    if argv:
        print("usage: leftovers.py", file=sys.stderr)
        return 2
    for line in records.stop_leftovers(default_var_dir(dict(os.environ))):
        print(f"clockq: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
