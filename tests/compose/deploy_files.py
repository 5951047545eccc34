"""What the compose and Kubernetes tests share: where the deploy files are, the roles that
`manage.py runstack` and `manage.py healthcheck` really accept, the settings that clockq reads
from a file, and the secret files that compose/make-secrets.sh writes."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

from clockq.management.commands.healthcheck import Command as Healthcheck
from clockq.management.commands.runstack import Command as Runstack
from clockq.stack import preflight
from tests.harness import ROOT

COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
NFS_FILE = COMPOSE_DIR / "compose.nfs.yaml"
KUBERNETES_DIR = COMPOSE_DIR / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
MAKE_SECRETS = COMPOSE_DIR / "make-secrets.sh"
MANAGE = ["python", "manage.py"]


def runstack_role(argv: list[str]) -> str:
    """The one role a container's command starts, as runstack's own parser reads it; AssertionError
    when the command is not `python manage.py runstack --role ROLE` with a real role."""
    assert argv[:3] == [*MANAGE, "runstack"], f"not a runstack command: {argv}"
    options = Runstack().create_parser("manage.py", "runstack").parse_args(argv[3:])
    roles = preflight.parse_roles(options.role)  # ValueError for a role that is none
    assert not roles.whole and len(roles.names) == 1, f"one role per container, not {options.role!r}"
    return options.role


def healthcheck_role(argv: list[str]) -> str:
    """The role a health check or probe asks about (`python manage.py healthcheck --role ROLE`)."""
    assert argv[:3] == [*MANAGE, "healthcheck"], f"not a healthcheck command: {argv}"
    options = Healthcheck().create_parser("manage.py", "healthcheck").parse_args(argv[3:])
    preflight.parse_roles(options.role)
    return options.role


@cache
def settings_read_from_files() -> frozenset[str]:
    """The settings that clockq/settings.py reads (in its parts, clockq/config/) with env_or_file:
    each also has a *_FILE form."""
    source = "".join(path.read_text() for path in sorted((ROOT / "clockq" / "config").glob("*.py")))
    return frozenset(re.findall(r'env_or_file\("([A-Z_]+)"\)', source))


def make_secrets(folder: Path, **env: str) -> dict[str, str]:
    """Run compose/make-secrets.sh into `folder`; the files it holds then, by name."""
    done = subprocess.run(["sh", str(MAKE_SECRETS), str(folder)], env={"PATH": "/usr/bin:/bin", **env}, timeout=60)
    assert done.returncode == 0
    return {path.name: path.read_text() for path in sorted(folder.iterdir())}


def image_uid() -> int:
    """The numeric user the Dockerfile runs as."""
    [user] = re.findall(r"^USER\s+(\d+)(?::\d+)?\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    return int(user)
