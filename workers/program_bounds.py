"""What holds a running program besides its namespaces: its memory limit and its own network,
both in place before it runs a single instruction of its own.

bwrap starts with `--block-fd`: it sets the sandbox up, then waits on that pipe before its first
process forks the program. Meanwhile the worker moves that process into the program's cgroup
(workers/memory_bound.py) and connects its network namespace (workers/program_network.py), and
only then writes to the pipe. What goes wrong on the way kills the sandbox before it is released.
Without bwrap (CLOCKQ_COMMAND_SANDBOX=none) there is nothing to hold: the watchdog watches the
program from its start.
"""

from __future__ import annotations

import os
import signal

from workers.memory_bound import Enforcement, MemoryBound, watched_processes
from workers.program_network import NetworkMode, PrivateNetwork
from workers.sandbox import Pidfd, Sandbox


class ProgramBounds:
    """One running program's memory bound and network: `memory_verdict` says why it was killed
    for its memory ('' when it was not)."""

    def __init__(self, own: Pidfd, memory: MemoryBound | None, network: PrivateNetwork | None):
        self._own = own  # what a memory kill signals: the sandbox's first process, or the program
        self.memory = memory
        self.network = network

    @classmethod
    def hold(
        cls, sandbox: Sandbox, *, job_id: int, uid: int | None, target: Pidfd, block_fd: int | None
    ) -> ProgramBounds:
        """Put the bounds of the program whose sandbox's first process (or, without a sandbox, the
        program) is `target` in place, then release it through `block_fd` (closed here). Where
        that fails, the sandbox is killed first and the error goes up (OSError, NetworkUnavailable)."""
        own = Pidfd(target.pid, os.dup(target.fd))
        bounds = cls(own, None, None)
        try:
            bounds._set_up(sandbox, job_id, uid)
        except BaseException:
            own.send(signal.SIGKILL)
            own.wait()  # gone before its pipe closes, which would release it too
            bounds.close()
            raise
        finally:
            if block_fd is not None:
                with os.fdopen(block_fd, "wb", buffering=0) as release:
                    if bounds._own.fd >= 0:
                        release.write(b"1")
        if bounds.memory is not None:
            bounds.memory.start()
        return bounds

    def _set_up(self, sandbox: Sandbox, job_id: int, uid: int | None) -> None:
        policy, pid = sandbox.memory, self._own.pid
        if policy.enforcement is Enforcement.CGROUP:
            name = f"clockq-uid{uid}" if uid is not None else f"clockq-{os.getpid()}-job{job_id}"
            self.memory = MemoryBound.in_cgroup(policy, name, pid, self._kill)
        elif policy.enforcement is Enforcement.WATCHDOG:
            sandboxed = sandbox.bwrap is not None
            processes = watched_processes(
                uid=uid,
                namespace_pid=pid if sandboxed else None,
                session=None if sandboxed else pid,
                tmpfs=sandbox.tmpfs_mounts() if sandboxed else (),
            )
            self.memory = MemoryBound(policy, self._kill, processes=processes)
        if sandbox.bwrap is not None and sandbox.network is NetworkMode.PRIVATE:
            assert sandbox.slirp4netns is not None
            self.network = PrivateNetwork.launch(sandbox.slirp4netns, pid, uid)
            self.network.wait_ready()

    @property
    def memory_verdict(self) -> str:
        return self.memory.verdict if self.memory is not None else ""

    def stop(self) -> None:
        """Before the program's processes are reaped: no more memory looks (and kills)."""
        if self.memory is not None:
            self.memory.stop()

    def close(self) -> None:
        """Once they are gone: the memory verdict kept, the cgroup removed, slirp4netns killed."""
        if self.memory is not None:
            self.memory.close()
        if self.network is not None:
            self.network.stop()
            self.network = None
        self._own.close()

    def _kill(self) -> None:
        self._own.send(signal.SIGKILL)
