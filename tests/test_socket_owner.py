"""The uid owning a TCP socket of this host (clockq/socket_owner.py), asked of the kernel by
sock_diag netlink and, where that is refused, read from /proc/net/tcp: both agree, on real sockets."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

from clockq import socket_owner as owner

WAYS = [owner._ask_sock_diag, owner._read_proc_net_tcp]


def ends(client: socket.socket) -> tuple[tuple, tuple]:
    """(local, remote) of `client`'s connection, as socket_owner takes them."""
    local, remote = client.getsockname(), client.getpeername()
    return (ipaddress.ip_address(local[0]), local[1]), (ipaddress.ip_address(remote[0]), remote[1])


@pytest.mark.parametrize("way", WAYS, ids=lambda way: way.__name__)
@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_both_ways_find_the_owner_of_a_live_socket_and_none_once_it_is_closed(way, family, host):
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        client = socket.socket(family)
        client.connect(server.getsockname()[:2])
        accepted, _peer = server.accept()
        with accepted:
            local, remote = ends(client)
            assert way(local, remote) == os.geteuid()
            assert way(remote, local) == os.geteuid()  # the server's end
            assert way((local[0], local[1] ^ 1), remote) is None  # no such socket
            client.close()
            assert way(local, remote) is None
