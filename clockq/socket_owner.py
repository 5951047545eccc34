"""The uid that owns a TCP socket of this host (of this network namespace), found by its two ends:
for clockq/login_source.py, which tells a job's logins from the admin's by it.

It asks the kernel through sock_diag netlink for exactly that socket, as `ss` does: about 40 µs.
Reading /proc/net/tcp, which walks the kernel's whole table of connections, took 10 ms with 60
sockets, and Flower asks on every request that carries a login: 10,000 made-up logins cost 100
s of the kernel's time. /proc/net/tcp and tcp6 remain the fallback where netlink is refused.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import struct
import sys

from clockq.ratelimit import RateLimitedWarnings

log = logging.getLogger("clockq.socket_owner")
_warnings = RateLimitedWarnings(log)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[IPAddress, int]

# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_DIAG_UID_INODE = struct.Struct("=II")  # inet_diag_msg's idiag_uid, idiag_inode
_DIAG_UID_AT = 64  # their offset in inet_diag_msg: family, state, timer, retrans, the sockid, 3 counters

PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")


def socket_owner(local: Endpoint, remote: Endpoint) -> int | None:
    """The uid owning the TCP socket from `local` to `remote`; None when there is none held by a
    process: none at all, one closed already, one in TIME_WAIT (which the kernel shows as root's)."""
    try:
        return _ask_sock_diag(local, remote)
    except OSError as exc:
        _warnings.warn(f"sock_diag netlink refused ({exc}): reading /proc/net/tcp instead, which is slower")
    return _read_proc_net_tcp(local, remote)


def _ask_sock_diag(local: Endpoint, remote: Endpoint) -> int | None:
    family = socket.AF_INET6 if local[0].version == 6 else socket.AF_INET
    sockid = struct.pack("!HH", local[1], remote[1]) + _padded(local[0]) + _padded(remote[0])
    sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)  # any interface, any cookie
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + sockid
    message = _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as netlink:
        netlink.send(message + request)
        answer = netlink.recv(65536)
    _length, kind, _flags, _sequence, _port = _NLMSG_HEADER.unpack_from(answer)
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", answer, _NLMSG_HEADER.size)
        if -code == errno.ENOENT:
            return None
        raise OSError(-code, f"sock_diag: {errno.errorcode.get(-code, -code)}")
    uid, inode = _DIAG_UID_INODE.unpack_from(answer, _NLMSG_HEADER.size + _DIAG_UID_AT)
    return uid if inode else None


def _padded(ip: IPAddress) -> bytes:
    return ip.packed.ljust(16, b"\0")


def _read_proc_net_tcp(local: Endpoint, remote: Endpoint) -> int | None:
    for path in PROC_NET_TCP:
        tcp6 = path.endswith("6")
        local_text, remote_text = _proc_endpoint(*local, tcp6=tcp6), _proc_endpoint(*remote, tcp6=tcp6)
        try:
            with open(path) as table:
                next(table, None)  # the header
                for line in table:
                    fields = line.split()
                    # sl local rem st queues timer retransmits uid timeout inode ...
                    if fields[1] == local_text and fields[2] == remote_text and fields[9] != "0":
                        return int(fields[7])
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
        except OSError as exc:
            _warnings.warn(f"cannot read {path} to find a login's socket ({exc})")
            return None
    return None


def _proc_endpoint(ip: IPAddress, port: int, *, tcp6: bool) -> str:
    """`ip`:`port` as /proc/net/tcp[6] prints them: each 32-bit word of the address in host byte
    order, in hex, then the port. An IPv4 address in tcp6 is IPv4-mapped."""
    if tcp6 and ip.version == 4:
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    packed = ip.packed
    words = (int.from_bytes(packed[i : i + 4], sys.byteorder) for i in range(0, len(packed), 4))
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"
