"""The workloads a job may name: only those listed in settings.CLOCKQ_WORKLOADS."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from workers.workloads.base import Workload
from workers.workloads.params import ParamsError, clean_params


class UnknownWorkload(LookupError):
    pass


@cache
def workload_class(name: str) -> type[Workload]:
    path = settings.CLOCKQ_WORKLOADS.get(name) if isinstance(name, str) else None
    if path is None:
        raise UnknownWorkload(f"unknown workload {str(name)[:50]!r}; allowed: {', '.join(available())}")
    return import_string(path)


def available() -> list[str]:
    return sorted(settings.CLOCKQ_WORKLOADS)


def validate(name: str, params: Any, *, is_staff: bool) -> dict[str, Any]:
    """Check that `name` may be run by this user and return its cleaned params.

    Raises UnknownWorkload, PermissionError or ParamsError.
    """
    cls = workload_class(name)
    if cls.staff_only and not is_staff:
        raise PermissionError(f"the {name!r} workload is for staff only")
    return clean_params(cls.params_schema, params)


def create(name: str, params: dict[str, Any]) -> Workload:
    cls = workload_class(name)
    return cls(clean_params(cls.params_schema, params))


__all__ = ["ParamsError", "UnknownWorkload", "available", "create", "validate", "workload_class"]
