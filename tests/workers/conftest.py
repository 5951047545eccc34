"""Fixtures for the worker side."""

from __future__ import annotations

import pynvml
import pytest

from workers import probes


@pytest.fixture
def no_nvml(monkeypatch):
    """NVML fails to load, as on a host without an NVIDIA driver."""

    def library_not_found():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(probes, "_nvml", probes._NvmlLibrary())
    monkeypatch.setattr(pynvml, "nvmlInit", library_not_found)
