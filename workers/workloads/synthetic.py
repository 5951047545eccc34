"""A deterministic workload for tests, demos and benchmarks: it sleeps like a GPU kernel."""

from __future__ import annotations

import hashlib
import struct
import time
from pathlib import Path

from workers.workloads.base import RunContext, Workload

_HEADER = struct.Struct("<QQ")  # (steps done, payload length)


class SyntheticWorkload(Workload):
    name = "synthetic"

    def setup(self, ctx: RunContext) -> None:
        # A framework's setup at each start (imports, a model build, a data load): it cannot be
        # cut short, so an RT job that comes meanwhile runs in the GPU's RT lane, not after it.
        time.sleep(self.params.get("setup_ms", 0.0) / 1000.0)
        self.done = 0
        # Its "device memory": mutable, so a snapshot has to copy it, as from a real GPU.
        self.payload = bytearray(_payload(ctx.job_id, self.params["state_kb"] * 1024))
        self.failures_file = ctx.work_dir / "injected-failures"

    def step(self) -> float:
        if self.done == self.params["fail_at_step"] and self._inject_failure():
            raise RuntimeError(f"injected failure at step {self.done}")
        if self.params["step_ms"]:
            time.sleep(self.params["step_ms"] / 1000.0)
        self.done += 1
        return self.done / self.params["steps"]

    def metrics(self) -> list[tuple[int, str, float]]:
        # A made-up loss that falls as the steps go by: deterministic, for tests and demos.
        return [(self.done, "loss", 1.0 / self.done)] if self.done else []

    def _inject_failure(self) -> bool:
        # The count lives outside the checkpoint, so a rollback does not reset it.
        raised = int(self.failures_file.read_text()) if self.failures_file.exists() else 0
        if raised >= self.params["fail_times"]:
            return False
        self.failures_file.write_text(str(raised + 1))
        return True

    def state_dict(self) -> bytes:
        return _HEADER.pack(self.done, len(self.payload)) + self.payload

    def snapshot(self) -> list[bytes | bytearray]:
        return [_HEADER.pack(self.done, len(self.payload)), self.payload]

    def load_state_dict(self, state: bytes) -> None:
        done, length = _HEADER.unpack_from(state)
        payload = memoryview(state)[_HEADER.size :]
        if len(payload) != length:
            raise ValueError(f"synthetic state truncated: {len(payload)} of {length} bytes")
        if len(self.payload) == length:
            self.payload[:] = payload  # into the memory it has, as a copy to the device would
        else:
            self.payload = bytearray(payload)
        self.done = done

    def write_result(self, directory: Path) -> None:
        (directory / "state.bin").write_bytes(self.state_dict())

    def declared_gpu_util(self) -> float | None:
        return self.params["gpu_util"]


def _payload(seed: int, size: int) -> bytes:
    """Deterministic bytes of the given size, cheap to make even at 100 MB."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    reps, rest = divmod(size, len(block))
    return block * reps + block[:rest]
