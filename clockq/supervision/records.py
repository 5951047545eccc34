"""What a supervisor started, written down, so that nothing it started outlives it unnoticed.

Each supervisor (clockq/supervision/supervisor.py: `runstack`, `gpuworkers`) keeps a record of
itself and of each child it started, by pid and start time (clockq/supervision/procs.py), in
`var/stack/<its pid>.json`, and removes it once it has stopped them all. A record whose
supervisor is gone names what may be left of that stack: each recorded child still alive, and
what is left of its process group (a gunicorn's workers, a Celery worker's pool).

Two things read it:

- the supervisor's undertaker (`watch`, this file run as a script), a small process of its own
  session that holds the read end of a pipe whose write end only the supervisor holds: when the
  pipe ends, the supervisor is gone, whatever killed it, and the undertaker stops what its
  record still names;
- the next start (`stop_leftovers`: `make run` runs clockq/stack/leftovers.py before anything
  else; `runstack` calls it too), which stops what an earlier start of this checkout left
  running instead of refusing on the ports it holds, and says so.

Only what a record names is ever signalled, and only while it is that process (same start time,
same user); a process it has no record of, another checkout's (another var/), another user's,
or one that took a recorded pid, is never touched.

Standard library only: `make run` loads this file with the system's python3 before the virtual
environment exists, and the undertaker runs it as a script.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__:
    from clockq.supervision import procs
else:  # run as a script (the undertaker, `make run`): its folder is on the path, the clockq package is not
    import procs  # type: ignore[no-redef]

RECORD_DIR_NAME = "stack"
# How long a leftover gets to stop on SIGTERM before SIGKILL, at the next start: what is left
# of a stack is most likely what hung, and the start waits for it.
LEFTOVER_GRACE_S = 10.0


@dataclass(frozen=True)
class Record:
    """A supervisor and the children it started, as it wrote them down."""

    path: Path
    name: str
    supervisor: procs.Identity
    boot_id: str
    uid: int
    cwd: Path
    children: dict[str, procs.Identity]


def record_dir(var_dir: Path) -> Path:
    return var_dir / RECORD_DIR_NAME


def write_record(folder: Path, name: str, children: dict[str, procs.Identity]) -> Path:
    """Write (atomically, 0600) this process's record as the supervisor `name` of `children`."""
    folder.mkdir(parents=True, exist_ok=True)
    me = procs.identity(os.getpid())
    assert me is not None  # this process is alive
    path = folder / f"{me.pid}.json"
    body = {
        "name": name,
        "supervisor": [me.pid, me.start],
        "boot_id": procs.boot_id(),
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "children": {child: [who.pid, who.start] for child, who in children.items()},
    }
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh)
    os.replace(tmp, path)
    return path


def read_record(path: Path) -> Record:
    """The record in `path`. ValueError saying what is wrong when it is not one; FileNotFoundError
    when it is gone (its supervisor removed it)."""
    try:
        body = json.loads(path.read_text())
        return Record(
            path=path,
            name=str(body["name"]),
            supervisor=procs.Identity(*map(int, body["supervisor"])),
            boot_id=str(body["boot_id"]),
            uid=int(body["uid"]),
            cwd=Path(body["cwd"]),
            children={str(k): procs.Identity(*map(int, v)) for k, v in body["children"].items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a supervisor's record ({exc.__class__.__name__}: {exc})") from None


def left_running(record: Record) -> dict[str, list[procs.Identity]]:
    """What is alive of each child the record names: the child itself, while it is that process,
    and the rest of its process group (what it started, which its group keeps even after it
    ends), by the record's user only, started after it."""
    everyone = procs.all_seen()
    found: dict[str, list[procs.Identity]] = {}
    for name, child in record.children.items():
        now = procs.seen(child.pid)
        if now is not None and now.start != child.start:
            # The pid is someone else's now: the kernel gave it out again, so the child's group,
            # which would have kept the number taken, had ended before.
            continue
        alive = [
            procs.Identity(p.pid, p.start)
            for p in everyone
            if p.pgrp == child.pid
            and p.uid == record.uid
            and p.start >= child.start
            and (now is not None or _works_in_the_stack(p.pid, record))
        ]
        if alive:
            found[name] = alive
    return found


def _works_in_the_stack(pid: int, record: Record) -> bool:
    """With the group's leader gone, a member must also work where the stack did (its
    supervisor's folder, or var/ where the embedded Redis keeps its files)."""
    cwd = procs.working_directory(pid)
    var_dir = record.path.parent.parent
    return cwd is not None and any(cwd == root or root in cwd.parents for root in (record.cwd, var_dir))


@dataclass(frozen=True)
class Stopped:
    """What `stop` did: those that needed SIGKILL, and those that outlived even that."""

    killed: list[procs.Identity]
    stuck: list[procs.Identity]


def stop(processes: list[procs.Identity], grace_s: float) -> Stopped:
    """SIGTERM (and SIGCONT, so a stopped one acts on it), then SIGKILL to those still alive after
    `grace_s`. A process that outlives even SIGKILL is stuck in the kernel."""
    fds = {fd: who for who in processes if (fd := procs.open_pidfd(who)) is not None}
    try:
        for fd in fds:
            procs.send(fd, signal.SIGTERM)
            procs.send(fd, signal.SIGCONT)
        left = procs.wait_gone(list(fds), grace_s)
        for fd in left:
            procs.send(fd, signal.SIGKILL)
        stuck = procs.wait_gone(left, 5.0)
        return Stopped(killed=[fds[fd] for fd in left], stuck=[fds[fd] for fd in stuck])
    finally:
        for fd in fds:
            os.close(fd)


def stop_record(record: Record, grace_s: float) -> str | None:
    """Stop what is left of a dead supervisor's stack and remove its record once nothing is.
    What was stopped, in words, or None when nothing was left."""
    found = left_running(record)
    done = stop([who for group in found.values() for who in group], grace_s) if found else Stopped([], [])
    if not done.stuck:
        with contextlib.suppress(FileNotFoundError):
            record.path.unlink()
    if not found:
        return None
    parts = []
    for name, group in sorted(found.items()):
        leader = record.children[name]
        if leader not in group:
            parts.append(f"{name} ({len(group)} of its group; pid {leader.pid} itself had ended)")
        else:
            more = f" and {len(group) - 1} more of its group" if len(group) > 1 else ""
            parts.append(f"{name} (pid {leader.pid}{more})")
    said = ", ".join(parts)
    if done.killed:
        said += f"; killed after {grace_s:g} s: {_pids(done.killed)}"
    if done.stuck:
        said += f"; still running after SIGKILL: {_pids(done.stuck)}"
    return said


def _pids(processes: list[procs.Identity]) -> str:
    return ", ".join(f"pid {who.pid}" for who in processes)


def stop_leftovers(var_dir: Path, grace_s: float = LEFTOVER_GRACE_S) -> list[str]:
    """Stop what earlier starts of this checkout (this var/) left running: the stacks whose
    supervisor is gone. The records of a live supervisor are left alone, as is everything they
    name. Returns what to tell the user."""
    said: list[str] = []
    done: set[Path] = set()
    boot = procs.boot_id()
    # A pass can orphan another record (a `gpuworkers` stopped as a leftover of `runstack`
    # leaves its own workers' record if it had to be killed): the next pass takes that one.
    for _pass in range(3):
        dead = []
        for path in sorted(record_dir(var_dir).glob("*.json")):
            if path in done:
                continue
            try:
                record = read_record(path)
            except FileNotFoundError:
                continue
            except ValueError as exc:
                said.append(f"left alone: {exc}; delete it if no clockq of this checkout runs")
                done.add(path)
                continue
            if record.boot_id != boot:
                path.unlink(missing_ok=True)  # from before a reboot: nothing of it runs
            elif record.uid == os.getuid() and not procs.is_alive(record.supervisor):
                dead.append(record)
        if not dead:
            break
        for record in dead:
            done.add(record.path)
            if what := stop_record(record, grace_s):
                said.append(
                    f"stopped what an earlier {record.name} (pid {record.supervisor.pid}, now gone) of this "
                    f"checkout left running: {what}"
                )
    return said


def watch(read_fd: int, path: Path, grace_s: float) -> int:
    """The undertaker: wait until the supervisor's pipe ends, then stop what its record still
    names (none when it stopped its children and removed the record itself)."""
    while os.read(read_fd, 4096):
        pass
    try:
        record = read_record(path)
    except FileNotFoundError:
        return 0  # a clean stop
    except ValueError as exc:
        print(f"clockq: its supervisor died, and {exc}", file=sys.stderr, flush=True)
        return 1
    what = stop_record(record, grace_s)
    if what:
        with contextlib.suppress(OSError):  # the terminal may be gone with the supervisor
            print(
                f"clockq: {record.name} (pid {record.supervisor.pid}) died; stopped {what}", file=sys.stderr, flush=True
            )
    return 0


def main(argv: list[str]) -> int:
    """`records.py watch FD RECORD GRACE_S`: the undertaker a supervisor starts."""
    if argv[:1] == ["watch"] and len(argv) == 4:
        return watch(int(argv[1]), Path(argv[2]), float(argv[3]))
    print("usage: records.py watch FD RECORD GRACE_S", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
