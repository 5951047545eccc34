"""Multi-GPU jobs (gangs): how many GPUs a job may ask for, and which GPUs a gang gets.

A gang needs all its GPUs at once: it starts on all of them or on none. Where it runs:

- **One host first.** A gang inside one host talks over the host's own links (NVLink, PCIe)
  instead of the network. Of the hosts that can hold it whole, it takes the one with the fewest
  free GPUs (best fit), so that the hosts with many free GPUs stay whole for the larger gangs.
- **Then the fewest hosts.** A gang no host can hold spreads over the hosts with the most free
  GPUs first, which is the fewest hosts that can hold it; the last host it needs is again the
  best fit for what remains.

Ranks are numbered host by host, rank 0 on the first host (its address is the gang's
MASTER_ADDR), so each host's ranks are consecutive and LOCAL_RANK is a rank's place on its host.
Everything here is pure. The submit check asks `size_problem` (clockq/fleet/capacity.py);
`place` is the rule the live gang claim is to ask, and the replay too once its cluster has
hosts: neither does yet (the workers run each job on one GPU, and the replay counts GPUs in one
pool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Seat:
    """One rank of a gang: the GPU worker that runs it and where it stands."""

    worker: str
    host: str
    rank: int
    local_rank: int
    local_world_size: int


def size_problem(gpus: object, *, cluster_gpus: int, largest_runnable: int) -> str | None:
    """Why a job may not ask for `gpus` GPUs, as a sentence for the submitter; None when it may.
    `cluster_gpus` is how many GPUs the cluster has (its registered GPU workers, drained ones
    included: a drain ends); `largest_runnable` the most its workers can run as one job."""
    if type(gpus) is not int:
        return "must be a whole number of GPUs"
    if gpus < 1:
        return "must be at least 1"
    largest = min(cluster_gpus, largest_runnable)
    if gpus <= max(largest, 1):  # a 1-GPU job waits for its first worker, as it always has
        return None
    if largest_runnable < cluster_gpus:
        return (
            f"{gpus} GPUs asked for; this cluster's GPU workers run jobs of at most {largest_runnable} "
            f"GPU{'s' if largest_runnable != 1 else ''} (it has {cluster_gpus})"
        )
    if cluster_gpus == 0:
        return f"{gpus} GPUs asked for; this cluster has no GPU workers registered yet"
    return f"{gpus} GPUs asked for; this cluster has {cluster_gpus}, the largest job it can run"


def place(gpus: int, free_by_host: Mapping[str, Sequence[str]]) -> tuple[Seat, ...] | None:
    """The seats of a gang of `gpus` on the free GPU workers `free_by_host` (host -> its free
    workers, in GPU order), or None when they are too few: a gang never starts on part of its
    GPUs. One host where one can hold it, else the fewest hosts (the module's docstring)."""
    if gpus < 1 or sum(len(w) for w in free_by_host.values()) < gpus:
        return None
    # The hosts with the most free GPUs first: taking them is the fewest hosts. At each step, a
    # host that can hold the rest whole takes it, the one with the fewest free that can (best
    # fit); the first step is the one-host case.
    rest = sorted(((h, list(w)) for h, w in free_by_host.items() if w), key=lambda hw: (-len(hw[1]), hw[0]))
    chosen: list[tuple[str, list[str]]] = []
    left = gpus
    while left:
        fits = [(len(workers), host, workers) for host, workers in rest if len(workers) >= left]
        if fits:
            _, host, workers = min(fits)
            chosen.append((host, workers[:left]))
            break
        host, workers = rest.pop(0)
        chosen.append((host, workers))
        left -= len(workers)
    return _seats(chosen)


def _seats(groups: Sequence[tuple[str, Sequence[str]]]) -> tuple[Seat, ...]:
    seats: list[Seat] = []
    for host, workers in groups:
        for local, worker in enumerate(workers):
            seats.append(Seat(worker, host, len(seats), local, len(workers)))
    return tuple(seats)


def hosts_of(seats: Sequence[Seat]) -> list[str]:
    """The hosts of a gang, rank 0's first."""
    return list(dict.fromkeys(s.host for s in seats))
