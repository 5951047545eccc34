"""The workloads a job may name, and the params each one accepts.

Only names listed in settings.CLOCKQ_WORKLOADS may run; a form never names arbitrary code. The
params schema of each workload lives here, in the core, because the web form, the API, the
admin and the workers all validate against it. The code that runs a workload lives in
`workers/workloads/`, and CLOCKQ_WORKLOADS maps each name to its class there.

A new workload is three things: its spec in SPECS below, its class in `workers/workloads/`, and
a line in CLOCKQ_WORKLOADS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from clockq.jobs.workload_params import Float, Int, ParamsError, Schema, StrList, clean_params


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    params: Schema
    # Runs a program the submitter brings: only users with the `jobs.run_command` permission
    # (granted in the admin; superusers have every permission) may submit it.
    runs_user_code: bool = False
    # The param that declares the size of the job's state in KB, where there is one: the
    # storage quota counts it at submit. Other workloads are counted by what they checkpoint.
    state_kb_param: str | None = None


SPECS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            "synthetic",
            {
                "steps": Int(1, 10_000_000, default=100, help="steps to run"),
                "step_ms": Float(0.0, 60_000.0, default=10.0, help="simulated GPU time per step"),
                "state_kb": Int(0, 1_048_576, default=64, help="checkpoint payload size"),
                "gpu_util": Float(0.0, 1.0, default=0.9, help="utilisation reported on simulated GPUs"),
                "setup_ms": Float(
                    0.0, 600_000.0, default=0.0, help="simulated setup at each start (a model build, a data load)"
                ),
                # Fault injection for tests and demos: raise at this step, this many times in all.
                "fail_at_step": Int(-1, 10_000_000, default=-1),
                "fail_times": Int(0, 1_000_000, default=0),
            },
            state_kb_param="state_kb",
        ),
        WorkloadSpec(
            "matmul",
            {
                "size": Int(2, 4096, default=256, help="matrix side"),
                "steps": Int(1, 1_000_000, default=200, help="products to compute"),
            },
        ),
        WorkloadSpec(
            "keras_train",
            {
                "steps": Int(1, 1_000_000, default=200, help="training steps (one batch each)"),
                "batch_size": Int(1, 4096, default=64, help="examples per batch"),
                "hidden": Int(1, 4096, default=64, help="width of the two hidden layers"),
                "learning_rate": Float(1e-6, 1.0, default=1e-3, help="Adam learning rate"),
                "seed": Int(0, 2**31 - 1, default=0, help="seed for the generated data and initial weights"),
                # 0: every batch is generated as it is needed. Otherwise the job trains on a
                # fixed dataset of this many generated examples, built once per host into
                # CLOCKQ_CACHE_DIR (or prefetched there while the cluster is quiet).
                "dataset_examples": Int(
                    0, 4_000_000, default=0, help="train on a fixed dataset of this many examples (0: stream)"
                ),
            },
        ),
        WorkloadSpec(
            "command",
            {
                "argv": StrList(64, 4096, help="program and arguments, run without a shell"),
                "step_ms": Float(1.0, 1000.0, default=20.0, help="how long each step waits on the program"),
            },
            runs_user_code=True,
        ),
    )
}


class UnknownWorkload(LookupError):
    pass


def available() -> list[str]:
    return sorted(settings.CLOCKQ_WORKLOADS)


def spec(name: Any) -> WorkloadSpec:
    """The spec of an enabled workload; UnknownWorkload for any other name."""
    if not isinstance(name, str) or name not in settings.CLOCKQ_WORKLOADS:
        raise UnknownWorkload(f"unknown workload {str(name)[:50]!r}; allowed: {', '.join(available())}")
    try:
        return SPECS[name]
    except KeyError:
        raise ImproperlyConfigured(
            f"CLOCKQ_WORKLOADS names {name!r}, which has no spec in clockq.jobs.workloads"
        ) from None


def declared_state_bytes(name: str, cleaned_params: dict[str, Any]) -> int:
    """The state size a job's params declare, in bytes (0 when the workload declares none)."""
    param = spec(name).state_kb_param
    return int(cleaned_params.get(param, 0)) * 1024 if param else 0


RUN_COMMAND_PERMISSION = "jobs.run_command"


def validate(name: Any, params: Any, *, may_run_commands: bool) -> dict[str, Any]:
    """Check that `name` may be submitted by someone who may (or may not) run their own programs,
    and return its cleaned params. `may_run_commands` is `user.has_perm(RUN_COMMAND_PERMISSION)`
    for a person; trusted code that re-checks an admitted job passes True.

    Raises UnknownWorkload, PermissionError or ParamsError.
    """
    found = spec(name)
    if found.runs_user_code and not may_run_commands:
        raise PermissionError(
            f"the {name!r} workload runs your own program: it needs the 'run command' permission, "
            "which an operator grants in the admin"
        )
    return clean_params(found.params, params)


__all__ = [
    "RUN_COMMAND_PERMISSION",
    "ParamsError",
    "UnknownWorkload",
    "WorkloadSpec",
    "available",
    "declared_state_bytes",
    "spec",
    "validate",
]
