"""Real compute on the CPU with numpy: repeated normalised matrix products."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from workers.workloads.base import RunContext, Workload


class MatmulWorkload(Workload):
    name = "matmul"

    def setup(self, ctx: RunContext) -> None:
        n = self.params["size"]
        rng = np.random.default_rng(ctx.job_id)
        self.b = rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n)
        self.a = rng.standard_normal((n, n)).astype(np.float32)
        self.done = 0

    def step(self) -> float:
        a = self.a @ self.b
        a = a / np.float32(max(float(np.linalg.norm(a)), 1e-12) / np.sqrt(a.size))
        # How much the normalised matrix still changes: it falls as the products converge.
        self.residual = float(np.linalg.norm(a - self.a) / np.sqrt(a.size))
        self.a = a
        self.done += 1
        return self.done / self.params["steps"]

    def metrics(self) -> list[tuple[int, str, float]]:
        return [(self.done, "residual", self.residual)]

    def state_dict(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, a=self.a, b=self.b, done=np.int64(self.done))
        return buf.getvalue()

    def load_state_dict(self, state: bytes) -> None:
        with np.load(io.BytesIO(state), allow_pickle=False) as data:
            a, b, done = data["a"], data["b"], int(data["done"])
        n = self.params["size"]
        if a.shape != (n, n) or b.shape != (n, n):
            raise ValueError(f"matmul state has shape {a.shape}, expected {(n, n)}")
        self.a, self.b, self.done = a, b, done

    def write_result(self, directory: Path) -> None:
        np.save(directory / "matrix.npy", self.a, allow_pickle=False)

    def declared_gpu_util(self) -> float | None:
        return 0.95
