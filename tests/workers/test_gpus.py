"""GPU discovery: NVML where it works, simulated GPUs where it does not."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from workers import gpus


def test_sim_setting_gives_simulated_gpus():
    found = gpus.discover("sim:3")
    assert [g.index for g in found] == [0, 1, 2] and all(g.simulated for g in found)


def test_without_nvml_auto_falls_back_to_two_simulated_gpus(monkeypatch):
    # This machine has no NVIDIA driver: the real NVML call fails, and that must be handled.
    try:
        real = gpus.nvml_gpus()
    except RuntimeError as exc:
        assert "NVML" in str(exc)
        found = gpus.discover("auto")
        assert len(found) == 2 and all(g.simulated for g in found)
    else:  # a GPU host: auto means every NVML GPU
        assert gpus.discover("auto") == real


def test_explicit_indices_without_nvml_are_a_configuration_error():
    try:
        gpus.nvml_gpus()
    except RuntimeError:
        with pytest.raises(ImproperlyConfigured, match="CLOCKQ_GPUS=0,1"):
            gpus.discover([0, 1])
    else:
        pytest.skip("NVML works here")
