"""The workload catalog: which workloads a job may name, who may run them, and their params."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from clockq.jobs import workloads
from clockq.jobs.apps import check_workloads_have_specs
from clockq.jobs.workloads import ParamsError, UnknownWorkload


def test_only_workloads_enabled_in_settings_can_be_named(settings):
    assert workloads.available() == ["command", "keras_train", "matmul", "synthetic"]
    settings.CLOCKQ_WORKLOADS = {"synthetic": "workers.workloads.synthetic.SyntheticWorkload"}
    assert workloads.available() == ["synthetic"]
    for name in ("matmul", "os.system", None, ["synthetic"]):
        with pytest.raises(UnknownWorkload, match="allowed: synthetic"):
            workloads.validate(name, {}, may_run_commands=True)


def test_an_enabled_workload_without_a_spec_is_a_configuration_error(settings):
    settings.CLOCKQ_WORKLOADS = {**settings.CLOCKQ_WORKLOADS, "mystery": "somewhere.Mystery"}
    with pytest.raises(ImproperlyConfigured, match="mystery"):
        workloads.validate("mystery", {}, may_run_commands=True)
    assert [e.id for e in check_workloads_have_specs()] == ["clockq.E001"]


def test_the_command_workload_needs_the_run_command_permission():
    with pytest.raises(PermissionError, match="'run command' permission"):
        workloads.validate("command", {"argv": ["true"]}, may_run_commands=False)
    assert workloads.validate("command", {"argv": ["true"]}, may_run_commands=True) == {
        "argv": ["true"],
        "step_ms": 20.0,
    }


@pytest.mark.parametrize(
    "bad",
    [
        {},  # argv is required
        {"argv": []},
        {"argv": "true"},
        {"argv": ["x"] * 65},
        {"argv": ["x" * 4097]},
        {"argv": ["a\x00b"]},
        {"argv": ["true"], "step_ms": 0.5},
        {"argv": ["true"], "step_ms": 1001},
        {"argv": ["true"], "shell": True},
    ],
)
def test_command_params_are_checked(bad):
    with pytest.raises(ParamsError):
        workloads.validate("command", bad, may_run_commands=True)


def test_keras_train_params_get_defaults():
    assert workloads.validate("keras_train", {}, may_run_commands=False) == {
        "steps": 200,
        "batch_size": 64,
        "hidden": 64,
        "learning_rate": 1e-3,
        "seed": 0,
        "dataset_examples": 0,
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"steps": 0},
        {"steps": 1_000_001},
        {"steps": 2.5},
        {"steps": True},
        {"batch_size": 4097},
        {"hidden": 0},
        {"learning_rate": 0.0},
        {"learning_rate": 2.0},
        {"learning_rate": float("nan")},
        {"learning_rate": "0.1"},
        {"seed": -1},
        {"seed": 2**31},
        {"optimizer": "sgd"},
        "not an object",
    ],
)
def test_keras_train_params_are_checked(bad):
    with pytest.raises(ParamsError):
        workloads.validate("keras_train", bad, may_run_commands=False)
