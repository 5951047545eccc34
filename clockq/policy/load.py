"""The load index, and the per-host summary of GPU telemetry that a load sample keeps.

**The load index** is what the predictor forecasts and what the control thresholds (admission
above 85%, prefetch below 30%, scale-out above 70%; clockq/policy/control.py) apply to:

    load = (busy GPUs + waiting GPU demand) / GPUs,  clamped to [0, CAP]  (CAP = 2.0)

- *busy GPUs*: jobs running now (each holds one GPU for its slice);
- *waiting GPU demand*: the GPUs that queued jobs ask for (one each today; a job that asks for
  several would count that many). Held jobs, an operator's or those held because admission is
  closed, are not demand: counting the jobs that admission holds back would keep the index above
  the threshold that closed it, and admission would never reopen;
- *GPUs*: the capacity, the GPU workers alive now (their heartbeats).

It is demand over capacity: 0 is an idle cluster, 1 means every GPU is spoken for with nothing
waiting, 1.5 means half as much again is waiting. Why this and not GPU utilisation: each job
holds its GPU exclusively for its slice, so a GPU running an input-bound job at 40% SM busy is
still not free for the next job; utilisation says how hard the GPUs work, not whether work is
waiting for one, and it cannot see a queue. Utilisation is still recorded with every sample
(`gpu_util`, with host CPU and memory), and it is the forecaster's GPU input.

Past 1 the index grows with the queue. It is clamped at CAP so that one burst of a thousand
queued jobs cannot stretch the scale the forecaster learns and drown out the interesting band
(0.3 to 1); every threshold lies below 1, so nothing is lost by the clamp. With no GPU worker
alive the capacity is unknown and the index is None (not recorded as 0 or as infinite).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

CAP = 2.0


def load_index(busy_gpus: int, waiting_gpus: int, gpus: int, cap: float = CAP) -> float | None:
    """(busy + waiting) / gpus, clamped to [0, cap]; None when there are no GPUs."""
    for name, value in (("busy_gpus", busy_gpus), ("waiting_gpus", waiting_gpus), ("gpus", gpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number of 0 or more, not {value!r}")
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap must be a positive number, not {cap!r}")
    if gpus == 0:
        return None
    return min((busy_gpus + waiting_gpus) / gpus, cap)


@dataclass(frozen=True)
class GpuReading:
    """What a load sample takes from one GPU's latest telemetry (clockq.bus.gpu_samples)."""

    host: str
    gpu_util: float | None
    host_cpu: float | None
    host_mem: float | None
    ts: float


@dataclass(frozen=True)
class HostLoad:
    host: str
    gpus: int  # GPU workers alive on this host (capacity)
    gpu_util: float | None  # mean over its GPUs that report it, 0..1
    cpu: float | None  # the host's CPU load, 0..1 (its newest reading)
    memory: float | None  # the host's memory use, 0..1 (its newest reading)
    busy: int = 0  # jobs running on this host's GPUs

    def as_dict(self) -> dict[str, float | int | None]:
        return {"gpus": self.gpus, "gpu_util": self.gpu_util, "cpu": self.cpu, "memory": self.memory, "busy": self.busy}


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def host_loads(
    readings: Iterable[GpuReading],
    busy_by_host: Mapping[str, int] | None = None,
    gpus_by_host: Mapping[str, int] | None = None,
) -> list[HostLoad]:
    """Per host, sorted by name: its GPU workers alive (`gpus_by_host`, from heartbeats; without
    it, the GPUs that sent telemetry), the mean GPU utilisation of its GPUs, its CPU and memory
    from its newest reading that has them (every GPU of a host reports the same host figures,
    taken at different moments), and its running jobs. A host known to any of the three is
    listed; what it did not report is None."""
    by_host: dict[str, list[GpuReading]] = {}
    for r in readings:
        by_host.setdefault(r.host, []).append(r)
    busy_by_host = busy_by_host or {}
    names = set(by_host) | {h for h, n in busy_by_host.items() if n} | set(gpus_by_host or {})
    out = []
    for host in sorted(names):
        rs = sorted(by_host.get(host, []), key=lambda r: r.ts, reverse=True)
        out.append(
            HostLoad(
                host=host,
                gpus=len(rs) if gpus_by_host is None else gpus_by_host.get(host, 0),
                gpu_util=mean(r.gpu_util for r in rs),
                cpu=next((r.host_cpu for r in rs if r.host_cpu is not None), None),
                memory=next((r.host_mem for r in rs if r.host_mem is not None), None),
                busy=busy_by_host.get(host, 0),
            )
        )
    return out


@dataclass(frozen=True)
class ClusterLoad:
    gpu_util: float | None  # mean over the GPUs that report it
    cpu: float | None  # mean over the hosts that report it
    memory: float | None


def cluster_load(readings: list[GpuReading], hosts: list[HostLoad]) -> ClusterLoad:
    """GPU utilisation is averaged over GPUs (a host with 8 GPUs weighs 8 times one with 1);
    CPU and memory over hosts, each host once."""
    return ClusterLoad(
        gpu_util=mean(r.gpu_util for r in readings),
        cpu=mean(h.cpu for h in hosts),
        memory=mean(h.memory for h in hosts),
    )
