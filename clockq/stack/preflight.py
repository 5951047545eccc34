"""What a role checks before it starts: a setup that would silently run alone is refused, with
a message that says what to change.

One machine (`--role all`, what `make run` starts) may use SQLite and a private Redis. A role
started on its own is part of a cluster, so it refuses:

- SQLite: a file on this host, which the other hosts cannot share;
- no REDIS_URL: only `--role all` starts a private broker;
- a broker on this host's loopback while other hosts are live on the database: they cannot
  reach it (`--role all` on a shared database is refused for the same reason);
- a checkpoint folder without the marker the web role wrote (clockq/fleet/marker.py), for the
  roles that read and write checkpoints (gpu, control).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

ROLES = ("web", "beat", "control", "predictor", "gpu", "flower")
ALL = "all"
# The roles that write or delete checkpoints and results, so must see the shared folder.
CHECKPOINT_ROLES = frozenset({"gpu", "control"})


@dataclass(frozen=True)
class Roles:
    names: frozenset[str]
    whole: bool  # `all`: everything on this one machine

    def __contains__(self, role: str) -> bool:
        return role in self.names

    def describe(self) -> str:
        return ALL if self.whole else ",".join(r for r in ROLES if r in self.names)


def parse_roles(raw: str) -> Roles:
    """`all`, or a comma list of roles. ValueError saying what is wrong."""
    parts = [p.strip().lower() for p in raw.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"name a role: {ALL} or a comma list of {', '.join(ROLES)}")
    if ALL in parts:
        if len(parts) > 1:
            raise ValueError(f"{ALL} already means every role; give it alone")
        return Roles(frozenset(ROLES), whole=True)
    unknown = [p for p in parts if p not in ROLES]
    if unknown:
        raise ValueError(f"unknown role(s) {', '.join(unknown)}; the roles are {ALL}, {', '.join(ROLES)}")
    return Roles(frozenset(parts), whole=False)


def is_loopback(host: str | None) -> bool:
    """Whether a broker host name or address can only be this machine."""
    if not host:
        return True  # a unix socket: this machine's
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def setup_problems(roles: Roles, *, sqlite: bool, embedded_broker: bool, admin_password_set: bool) -> list[str]:
    """What is wrong before anything is reached: the settings alone."""
    if roles.whole:
        return []
    problems = []
    if sqlite:
        problems.append(
            f"--role {roles.describe()} with SQLite: a file on this host, which the other hosts cannot share. "
            "Set DATABASE_URL to the cluster's PostgreSQL, or run everything on one machine with --role all"
        )
    if embedded_broker:
        problems.append(
            f"--role {roles.describe()} without REDIS_URL: only --role all starts a private broker. "
            "Set REDIS_URL to the cluster's Redis"
        )
    if "flower" in roles and not admin_password_set:
        problems.append(
            "--role flower needs CLOCKQ_ADMIN_PASSWORD (or CLOCKQ_ADMIN_PASSWORD_FILE): Flower's login is the "
            "admin's, and a password generated on this host would not be the web's"
        )
    return problems


def broker_problem(roles: Roles, *, local_broker: bool, broker: str, others: Iterable[str]) -> str | None:
    """A broker only this host can reach, while other hosts are live on the same database."""
    live = sorted(others)
    if not local_broker or not live:
        return None
    shown = ", ".join(live[:5]) + (f" and {len(live) - 5} more" if len(live) > 5 else "")
    private = "its own private Redis" if roles.whole else f"a Redis on this host's loopback ({broker})"
    return (
        f"host(s) {shown} are live on this database, but this host would use {private}, which they cannot "
        "reach: jobs dispatched here would never reach their GPUs. Set REDIS_URL to the cluster's Redis"
    )
