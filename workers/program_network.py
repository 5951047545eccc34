"""A command program's network (CLOCKQ_COMMAND_NETWORK): its own by default.

- **private** (the default): a network namespace of its own, which bwrap makes, connected
  outwards by Debian's `slirp4netns` (user-mode networking, as rootless Podman uses). slirp4netns
  runs as the job's uid, so the host's firewall sees the job's traffic as that uid's (an nftables
  `meta skuid` rule can allow or refuse it), and with `--disable-host-loopback` the host's
  loopback is out of reach: not the web server, Flower, Redis or PostgreSQL when they listen on
  127.0.0.1. The program sees only its own interfaces and sockets, in /proc/net too. Addresses
  of the host other than loopback are reached as any outside address is.
- **none**: a namespace of its own with loopback only.
- **host**: the host's network, loopback services included (unsafe: a job then reaches every
  service of the host that listens on 127.0.0.1).

slirp4netns is started while bwrap holds the sandbox at its --block-fd and the program is
released only once slirp4netns says the network is configured (--ready-fd). It is killed when the
program ends, and exits by itself if the worker dies (--exit-fd: the worker holds the other end).
Where it is missing, command jobs are refused with the reason rather than run with another
network than the operator chose: a program that needs its downloads would fail in a way that
hides why, and the host's network would open its loopback.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import select
import signal
import subprocess
import tempfile
from typing import IO, Any

NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace
READY_TIMEOUT_S = 10.0
TAP_NAME = "tap0"
TUN_DEVICE = "/dev/net/tun"  # slirp4netns makes the namespace's tap device through it


class NetworkMode(enum.Enum):
    PRIVATE = "private"
    NONE = "none"
    HOST = "host"


class NetworkUnavailable(RuntimeError):
    """slirp4netns could not give the program its network: the host's fault, not the job's."""


class PrivateNetwork:
    """slirp4netns for one running program's network namespace: launched, then awaited."""

    def __init__(self, proc: subprocess.Popen, exit_fd: int, ready_fd: int, errors: IO[bytes]):
        self.proc = proc
        self._exit_fd = exit_fd  # slirp4netns exits when this end closes, with the worker at the latest
        self._ready_fd = ready_fd
        self._errors = errors

    @classmethod
    def launch(cls, slirp4netns: str, namespace_pid: int, uid: int | None) -> PrivateNetwork:
        """Start connecting the network namespace of `namespace_pid` (the sandbox's first
        process, held before it forks the program), as `uid` (None: the worker's own user);
        `wait_ready` says when it is done. NetworkUnavailable saying why it could not start."""
        net, owner = _namespace_fds(namespace_pid)
        ready_read, ready_write = os.pipe()
        exit_read, exit_write = os.pipe()
        passed = (net, owner, ready_write, exit_read)
        argv = [
            slirp4netns,
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            "--enable-seccomp",
            f"--ready-fd={ready_write}",
            f"--exit-fd={exit_read}",
            f"--userns-path=/proc/self/fd/{owner}",
            "--netns-type=path",
            f"/proc/self/fd/{net}",
            TAP_NAME,
        ]
        user: dict[str, Any] = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - open until wait_ready or stop
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                pass_fds=passed,
                start_new_session=True,
                **user,
            )
        except OSError as exc:
            for fd in (ready_read, exit_write):
                os.close(fd)
            errors.close()
            raise NetworkUnavailable(f"cannot start slirp4netns: {exc.strerror or exc}") from None
        finally:
            for fd in passed:
                os.close(fd)
        return cls(proc, exit_write, ready_read, errors)

    def wait_ready(self) -> None:
        """Until slirp4netns has configured the network; NetworkUnavailable, with what it said,
        where it did not (it is stopped then)."""
        try:
            ready = _read_ready(self._ready_fd, self.proc)
        finally:
            os.close(self._ready_fd)
            self._ready_fd = -1
        if not ready:
            self._errors.seek(0)
            said = " / ".join(self._errors.read(2000).decode(errors="replace").strip().splitlines()[-3:])
            self.stop()
            raise NetworkUnavailable(f"slirp4netns could not configure the program's network: {said}")
        self._errors.close()

    def stop(self) -> None:
        """Kill slirp4netns and reap it: nothing of a program outlives it. Its exit takes the
        kernel about 20 ms (the tap device's teardown), paid when the program ends."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        for fd in (self._exit_fd, self._ready_fd):
            if fd >= 0:
                os.close(fd)
        self._exit_fd = self._ready_fd = -1
        self._errors.close()
        self.proc.wait()


def tun_problem(uid: int | None) -> str:
    """Why slirp4netns, run as `uid` (None: this process's user; its group is the same number,
    as `launch` runs it), cannot open TUN_DEVICE; '' when it can. Judged by the device's owner
    and mode: slirp4netns opens it from the program's user namespace, where the host checks the
    job's own uid. Debian's is 0666; a host that made it 0600 refuses every job uid."""
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.stat(TUN_DEVICE)
    except OSError as exc:
        return f"{TUN_DEVICE}: {exc.strerror or exc}"
    if uid == 0:
        return ""
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == uid else 0
    if (st.st_mode >> shift) & 0o6 == 0o6:
        return ""
    return f"{TUN_DEVICE} is mode {st.st_mode & 0o777:04o}, owned by uid {st.st_uid}: uid {uid} cannot open it"


def _namespace_fds(namespace_pid: int) -> tuple[int, int]:
    """Descriptors of the network namespace of `namespace_pid` and of the user namespace that
    owns it. bwrap may have put the sandbox's processes in a child of that user namespace (to
    mount /dev's devpts), from which slirp4netns could not configure the network."""
    try:
        net = os.open(f"/proc/{namespace_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetworkUnavailable(f"cannot reach the sandbox's network namespace: {exc.strerror or exc}") from None
    try:
        return net, fcntl.ioctl(net, NS_GET_USERNS)
    except OSError as exc:
        os.close(net)
        raise NetworkUnavailable(
            f"cannot find who owns the sandbox's network namespace: {exc.strerror or exc}"
        ) from None


def _read_ready(fd: int, proc: subprocess.Popen) -> bool:
    """Whether slirp4netns wrote its ready byte before it exited or READY_TIMEOUT_S passed."""
    readable, _, _ = select.select([fd], [], [], READY_TIMEOUT_S)
    if not readable:
        return False
    return os.read(fd, 1) == b"1" and proc.poll() is None
