"""Which hosts run clockq, and which GPU workers each has: registered by the launchers, read by
the start checks, the API and the admin. A host is live while its launcher refreshes `seen_at`."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from clockq.bus import lanes
from clockq.fleet.models import GpuWorker, Host

SEEN_EVERY_S = 15  # how often a host's launcher says it is alive
LIVE_S = 3 * SEEN_EVERY_S  # a host not seen for this long is not live


def broker_address(url: str) -> str:
    """The broker a REDIS_URL names, as host:port (or the socket's path), never its password."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


@transaction.atomic
def register_host(name: str, roles: Iterable[str], broker: str) -> Host:
    """This host starts `roles`: create or update its row, seen now. Roles another launcher of
    the same host started, and that is live, are kept; a drain stays as it was."""
    now = timezone.now()
    host, created = Host.objects.select_for_update().get_or_create(name=name, defaults={"seen_at": now})
    kept = set(host.roles) if not created and is_live(host) else set()
    host.roles, host.broker, host.started_at, host.seen_at = sorted(kept | set(roles)), broker, now, now
    host.save(update_fields=["roles", "broker", "started_at", "seen_at"])
    return host


def seen(name: str) -> None:
    Host.objects.filter(name=name).update(seen_at=timezone.now())


def live_hosts(*, besides: str | None = None) -> list[Host]:
    """Hosts whose launcher was seen within LIVE_S, except `besides`."""
    hosts = Host.objects.filter(seen_at__gte=timezone.now() - timedelta(seconds=LIVE_S))
    if besides is not None:
        hosts = hosts.exclude(name=besides)
    return list(hosts)


def is_live(host: Host) -> bool:
    return host.seen_at is not None and timezone.now() - host.seen_at < timedelta(seconds=LIVE_S)


@transaction.atomic
def register_gpu_workers(host_name: str, workers: Iterable[tuple[str, int]]) -> None:
    """`gpuworkers` on `host_name` starts these (name, GPU index): a row for each, its drain kept."""
    host, _ = Host.objects.get_or_create(name=host_name, defaults={"roles": ["gpu"], "seen_at": timezone.now()})
    now = timezone.now()
    for name, gpu_index in workers:
        GpuWorker.objects.update_or_create(
            name=name, defaults={"host": host, "gpu_index": gpu_index, "started_at": now}
        )


def host_of(worker_name: str) -> str:
    """gpu0@hostA -> hostA."""
    return worker_name.rpartition("@")[2]


def drained_names(worker_names: Iterable[str]) -> dict[str, str]:
    """Of these worker names, the drained ones (their own drain or their host's) -> who drained
    them and why, in one line. A GPU's RT lane is drained with its GPU. Two queries, whatever
    the count."""
    names = list(worker_names)
    gpu_of = {n: lanes.main_of(n) or n for n in names}
    hosts = {host_of(n) for n in names}
    drained_hosts = {
        h.name: _describe(h, "host " + h.name) for h in Host.objects.filter(name__in=hosts, drained_at__isnull=False)
    }
    drained_workers = {
        w.name: _describe(w, w.name)
        for w in GpuWorker.objects.filter(name__in=set(gpu_of.values()), drained_at__isnull=False)
    }
    found: dict[str, str] = {}
    for name in names:
        why = drained_workers.get(gpu_of[name]) or drained_hosts.get(host_of(name))
        if why is not None:
            found[name] = why
    return found


def is_drained(worker_name: str) -> bool:
    return bool(drained_names([worker_name]))


def _describe(row: Host | GpuWorker, what: str) -> str:
    at = f"{row.drained_at:%Y-%m-%d %H:%M:%S} UTC" if row.drained_at else "?"
    reason = f": {row.drain_reason}" if row.drain_reason else ""
    return f"{what} drained by {row.drained_by or 'an operator'} at {at}{reason}"
