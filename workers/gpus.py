"""Which GPUs this host has: real ones through NVML, or simulated ones (`CLOCKQ_GPUS=sim:N`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger("clockq.gpus")

DEFAULT_SIMULATED = 2


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_mib: int
    simulated: bool


def nvml_gpus() -> list[Gpu]:
    """The GPUs NVML sees. Raises RuntimeError when NVML is missing or fails."""
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is in requirements, but be clear if it is not
        raise RuntimeError(f"nvidia-ml-py is not installed: {exc}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"NVML unavailable: {exc}") from None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(i, name if isinstance(name, str) else name.decode(), memory.total // 2**20, False))
        return gpus
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"NVML query failed: {exc}") from None
    finally:
        pynvml.nvmlShutdown()


def simulated_gpus(count: int, memory_mib: list[int] | None = None) -> list[Gpu]:
    """`count` simulated GPUs; `memory_mib` gives each one's memory (the last value repeats)."""
    sizes = memory_mib or [16 * 1024]
    return [Gpu(i, "simulated GPU", sizes[min(i, len(sizes) - 1)], True) for i in range(count)]


def discover(setting: str | list[int], sim_memory_mib: list[int] | None = None) -> list[Gpu]:
    """Resolve CLOCKQ_GPUS (already parsed) into the GPUs this host should run workers for."""
    if isinstance(setting, str) and setting.startswith("sim:"):
        return simulated_gpus(int(setting[4:]), sim_memory_mib)
    try:
        real = nvml_gpus()
    except RuntimeError as exc:
        if setting == "auto":
            log.warning("%s; using %s simulated GPUs", exc, DEFAULT_SIMULATED)
            return simulated_gpus(DEFAULT_SIMULATED, sim_memory_mib)
        raise ImproperlyConfigured(f"CLOCKQ_GPUS={','.join(map(str, setting))} but {exc}") from None
    if setting == "auto":
        if not real:
            log.warning("NVML found no GPU; using %s simulated GPUs", DEFAULT_SIMULATED)
            return simulated_gpus(DEFAULT_SIMULATED, sim_memory_mib)
        return real
    assert not isinstance(setting, str)  # "auto" and "sim:N" were handled above
    by_index = {g.index: g for g in real}
    missing = [i for i in setting if i not in by_index]
    if missing:
        raise ImproperlyConfigured(f"CLOCKQ_GPUS names GPU(s) {missing} but NVML sees only {sorted(by_index)}")
    return [by_index[i] for i in setting]


def gpu_worker_env(gpu: Gpu) -> dict[str, str]:
    """Pin a worker to its GPU, and tell it what kind of GPU that is."""
    return {
        "CUDA_VISIBLE_DEVICES": str(gpu.index),
        "CLOCKQ_GPU_INDEX": str(gpu.index),
        "CLOCKQ_GPU_SIMULATED": "1" if gpu.simulated else "0",
        "CLOCKQ_GPU_MEMORY_MIB": str(gpu.memory_total_mib),
    }
