"""Who a login comes from, as the lockouts count it: django-axes on the web (the login page, the
admin, basic auth on the API) and clockq/flower.py, through this one rule.

A lockout keyed by address lets anyone who shares the address lock out everyone else on it. On
this host the jobs' programs share it: with the host's network a command job's connections come
from 127.0.0.1, as the admin's browser does, and from a network namespace of its own a job reaches
the host's other addresses through slirp4netns, which runs as the job's uid. Six wrong `admin`
logins from a job locked the admin out of both for 15 minutes.

So, for a connection from an address of this host, the lockout asks the kernel for the peer's
socket (the one whose local end is the peer's address and port and whose remote end is the
server's: clockq/socket_owner.py) and reads the uid that owns it. Every job's program runs as a
uid of its own (CLOCKQ_COMMAND_UID_BASE + the job's id, within CLOCKQ_COMMAND_UID_COUNT), so a
login from a socket of one of those uids is keyed by that uid, not by the address: a job's
failures lock out that job's logins, never anyone else's. A local peer whose socket has no owner
any more (closed before the server looked: what a job would do to hide) or cannot be looked up
is counted as a job's too, under one key of its own: it cannot be the admin's either.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
from dataclasses import dataclass

from clockq.socket_owner import IPAddress, socket_owner

# django-axes stores the address it keys on in a GenericIPAddressField (inet on PostgreSQL), so a
# job's key must be an address. These come from 100::/64, the discard-only block (RFC 6666), which
# no peer ever has: 100::<uid> for a job's uid, and one above every uid for a local peer whose
# socket has no owner.
_JOBS_BLOCK = int(ipaddress.IPv6Address("100::"))
UNATTRIBUTED_ADDRESS = str(ipaddress.IPv6Address(_JOBS_BLOCK + 2**32))

_IP_BIND_ADDRESS_NO_PORT = 24  # linux/in.h; Python 3.11's socket module does not name it


class SourceKind(enum.Enum):
    """Where a login comes from, as the lockouts tell sources apart."""

    REMOTE = "another machine"
    HOST = "this host"  # a socket of a uid that runs no job's program
    JOB = "a job on this host"  # a job's uid, or a local socket with no owner


@dataclass(frozen=True)
class LoginSource:
    """A login's source: its address, what kind of peer it is and, on this host, its socket's uid."""

    address: str
    kind: SourceKind
    uid: int | None = None

    @property
    def lockout_address(self) -> str:
        """The address the lockouts key on: the peer's own, or for a job the 100::/64 address of
        its uid (UNATTRIBUTED_ADDRESS where its socket's owner is unknown)."""
        if self.kind is not SourceKind.JOB:
            return self.address
        if self.uid is None:
            return UNATTRIBUTED_ADDRESS
        return str(ipaddress.IPv6Address(_JOBS_BLOCK + self.uid))

    def __str__(self) -> str:
        if self.kind is SourceKind.JOB:
            who = "a local socket with no owner" if self.uid is None else f"job uid {self.uid}"
            return f"{self.address} ({who})"
        return self.address


def login_source(
    address: str, peer_port: int | None, server: tuple[str, int] | None, job_uids: range | None = None
) -> LoginSource:
    """The source of a connection from `address`:`peer_port` to this server's `server` (address,
    port). `job_uids` are the uids jobs' programs run as (from the settings when None). A local
    address with either port unknown counts as a job's socket with no owner."""
    peer = _parse(address)
    if peer is None or not _is_local(peer):
        return LoginSource(address, SourceKind.REMOTE)
    if job_uids is None:
        from django.conf import settings

        base = settings.CLOCKQ_COMMAND_UID_BASE
        job_uids = range(base, base + settings.CLOCKQ_COMMAND_UID_COUNT)
    server_ip = _parse(server[0]) if server else None
    uid = None
    if peer_port is not None and server is not None and server_ip is not None:
        uid = socket_owner((peer, peer_port), (server_ip, server[1]))
    if uid is None or uid in job_uids:
        return LoginSource(address, SourceKind.JOB, uid)
    return LoginSource(address, SourceKind.HOST, uid)


def axes_client_ip(request) -> str:
    """AXES_CLIENT_IP_CALLABLE: the address django-axes keys a login on. gunicorn gives the peer's
    port (REMOTE_PORT) and the connection's socket; a server that gives neither (runserver) makes
    every local login one unattributed source, as one shared address was before."""
    meta = request.META
    address = meta.get("REMOTE_ADDR") or ""
    port = meta.get("REMOTE_PORT")
    server = None
    connection = meta.get("gunicorn.socket")
    if connection is not None:
        try:
            server = connection.getsockname()[:2]
        except OSError:
            server = None  # closed already
    return login_source(address, int(port) if port and port.isdigit() else None, server).lockout_address


def _parse(address: str) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # without an IPv6 zone
    except ValueError:
        return None  # a Unix socket's empty address, or nothing
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack server's view of an IPv4 peer
    return ip


def _is_local(ip: IPAddress) -> bool:
    """Whether `ip` is an address of this host (of this network namespace): one it may bind."""
    if ip.is_loopback:
        return True
    if ip.is_unspecified or ip.is_multicast:
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        if family == socket.AF_INET:
            probe.setsockopt(socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)  # no port taken
        try:
            probe.bind((str(ip), 0))
        except OSError:
            return False
    return True
