"""The slice switch's statements, and a submit's quota read, without the ORM's query compiler.

A switch runs about ten small statements: the claim, the boundary read, the requeue's
compare-and-set, its event, the slice row, the metric curves. Through the ORM each one cost
0.3-0.5 ms of Python (building and compiling the query) against about 0.05 ms for the statement
itself, so the ORM was most of a switch. These helpers write each statement's SQL once per shape
and then only adapt values and execute. Values go in and come out through the model fields' own
adapters (`get_db_prep_save`) and converters (`from_db_value` and the backend's), so what is read
and written is exactly what the ORM would read and write, on SQLite and PostgreSQL alike.

Only plain equality filters and these values are understood: a value, `F("field")` and
`F("field") + number`. Anything else goes through the ORM, unchanged in meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from numbers import Number
from typing import Any, NamedTuple, TypeVar, cast

from django.core.exceptions import FieldDoesNotExist
from django.db import connection, models
from django.db.models import F, Value
from django.db.models.expressions import CombinedExpression
from django.utils import timezone

from clockq.jobs.models import Job, UserQuota

Row = dict[str, Any]


class JsonText(str):
    """A JSON field's value already encoded (clockq/jobs/metrics.py builds curves' text as they
    grow): written as it is, not encoded again. Both backends take it as text (PostgreSQL casts
    the untyped parameter to jsonb)."""


def select_one(model: type[models.Model], pk: int, names: Sequence[str]) -> Row | None:
    """The fields `names` (field names or attnames, such as "tier_id") of the row with this
    primary key, as the ORM's `.values(*names).first()` would return them; None if there is none."""
    sql, converters = _select_sql(model, tuple(names), connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(sql, [pk])
        row = cursor.fetchone()
    if row is None:
        return None
    return {name: _convert(value, conv) for name, value, conv in zip(names, row, converters, strict=True)}


def update(model: type[models.Model], where: Mapping[str, Any], values: Mapping[str, Any]) -> int:
    """`model.objects.filter(**where).update(**values)`, equality filters only; returns the rows
    changed."""
    shape = tuple((name, _kind(value)) for name, value in values.items())
    if any(kind is None for _name, kind in shape):
        return model.objects.filter(**where).update(**values)
    sql, set_fields, where_fields = _update_sql(model, shape, tuple(where), connection.vendor)
    params: list[Any] = []
    for (name, kind), field in zip(shape, set_fields, strict=True):
        value = values[name]
        if kind == "value":
            params.append(_prep(field, value))
        elif kind and kind.startswith("add:"):
            params.append(value.rhs.value)
    params += [_prep(field, where[name]) for name, field in zip(where, where_fields, strict=True)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def insert(model: type[models.Model], values: Mapping[str, Any]) -> None:
    """Insert one row (its primary key left to the database): the fields in `values`, and every
    other one at its default (`auto_now` and `auto_now_add` fields: now)."""
    sql, fields, names = _insert_sql(model, connection.vendor)
    if unknown := set(values) - names:
        raise TypeError(f"{model.__name__} has no field(s) {sorted(unknown)}")
    now = None
    params = []
    for field in fields:
        if field.attname in values:
            value = values[field.attname]
        elif field.name in values:
            value = values[field.name]
        elif getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            value = now = now or timezone.now()
        else:
            value = field.get_default()
        params.append(_prep(field, value))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[models.Model], name: str) -> str:
    return connection.ops.quote_name(_field(model, name).column)


# --- SQL, once per shape ------------------------------------------------------------------------
# Each cache is keyed by the database vendor too, since quoting and adapters differ.

_T = TypeVar("_T")


def _once(build: Callable[..., _T]) -> Callable[..., _T]:
    """Memoise a statement builder by its arguments (a model class, names, the vendor)."""
    return cast(Callable[..., _T], cache(build))


def _field(model: type[models.Model], name: str) -> models.Field:
    meta = model._meta
    if name == "pk":
        return meta.pk  # type: ignore[return-value]
    for field in meta.concrete_fields:
        if name in (field.name, field.attname):
            return field
    raise FieldDoesNotExist(f"{model.__name__} has no field {name!r}")


def _prep(field: models.Field, value: Any) -> Any:
    """A value as the database takes it; a related object (tier=<QueueTier>) by its key, as the ORM."""
    if isinstance(value, JsonText):
        return str(value)
    if field.is_relation and isinstance(value, models.Model):
        value = value.pk
    return field.get_db_prep_save(value, connection)


def _kind(value: Any) -> str | None:
    """How a value in an UPDATE is written: "value" (a parameter), "copy:<field>" (another column),
    "add:<field>" (a column plus a number), or None (not understood here: the ORM writes it)."""
    if isinstance(value, F):
        return f"copy:{value.name}"
    if isinstance(value, CombinedExpression):
        lhs, rhs = value.lhs, value.rhs
        if value.connector == "+" and isinstance(lhs, F) and isinstance(rhs, Value) and isinstance(rhs.value, Number):
            return f"add:{lhs.name}"
        return None
    if hasattr(value, "resolve_expression"):
        return None
    return "value"


@_once
def _select_sql(model: type[models.Model], names: tuple[str, ...], _vendor: str) -> tuple[str, list]:
    fields = [_field(model, name) for name in names]
    converters = []  # per field: what the ORM's compiler would apply to the value read
    for field in fields:
        col = field.get_col(model._meta.db_table)
        functions = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        converters.append([(fn, col) for fn in functions])
    pk = model._meta.pk
    cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    sql = f"SELECT {cols} FROM {table(model)} WHERE {connection.ops.quote_name(pk.column)} = %s"
    return sql, converters


def _convert(value: Any, converters: list[tuple[Callable, Any]]) -> Any:
    for fn, col in converters:
        value = fn(value, col, connection)
    return value


@_once
def _update_sql(
    model: type[models.Model], shape: tuple[tuple[str, str], ...], where: tuple[str, ...], _vendor: str
) -> tuple[str, list, list]:
    quote = connection.ops.quote_name
    set_fields, sets = [], []
    for name, kind in shape:
        field = _field(model, name)
        set_fields.append(field)
        col = quote(field.column)
        if kind == "value":
            sets.append(f"{col} = %s")
        else:  # copy:<source> or add:<source>
            op, source = kind.split(":", 1)
            sets.append(f"{col} = {quote(_field(model, source).column)}{' + %s' if op == 'add' else ''}")
    where_fields = [_field(model, name) for name in where]
    conds = " AND ".join(f"{quote(f.column)} = %s" for f in where_fields)
    return f"UPDATE {table(model)} SET {', '.join(sets)} WHERE {conds}", set_fields, where_fields


@_once
def _insert_sql(model: type[models.Model], _vendor: str) -> tuple[str, list, frozenset[str]]:
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    names = frozenset(f.name for f in fields) | frozenset(f.attname for f in fields)
    return f"INSERT INTO {table(model)} ({cols}) VALUES ({marks})", fields, names


class QuotaRead(NamedTuple):
    """What a submit's quota check reads about an owner (clockq/jobs/quotas.py)."""

    max_active_jobs: int | None  # the owner's own limits (UserQuota); None: the default
    max_checkpoint_mb: int | None
    active: int  # jobs in the counted states, up to one past the active limit
    checkpoint_bytes: int  # summed over the owner's jobs
    result_bytes: int
    work_bytes: int = 0


def quota_read(owner_id: int, states: Sequence[str], default_max_active: int) -> QuotaRead:
    """A submit's quota read, in one statement: the owner's limits, how many of the owner's jobs
    are in `states`, and the checkpoint, result and work-folder bytes their jobs hold. The count stops one past
    the owner's active limit and runs on the (owner, state) index, and the sums run over the
    partial index job_owner_storage (the WHERE repeats its condition), so neither grows with the
    owner's history. Through the ORM these were three queries and 1.6 ms of Python, most of it
    building the two aggregates, against about 0.1 ms to run them."""
    sql = _quota_read_sql(len(states), connection.vendor)
    params = [owner_id, owner_id, owner_id, *map(str, states), owner_id, default_max_active, owner_id]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        max_active, max_mb, active, checkpoints, results, work = cursor.fetchone()
    return QuotaRead(max_active, max_mb, int(active), int(checkpoints or 0), int(results or 0), int(work or 0))


@_once
def _quota_read_sql(states: int, _vendor: str) -> str:
    job, owner, state = table(Job), column(Job, "owner_id"), column(Job, "state")
    checkpoints, results = column(Job, "checkpoint_bytes"), column(Job, "result_bytes")
    work = column(Job, "work_bytes")
    quota, quota_user = table(UserQuota), column(UserQuota, "user_id")
    max_active, max_mb = column(UserQuota, "max_active_jobs"), column(UserQuota, "max_checkpoint_mb")
    own_limit = f"SELECT {{}} FROM {quota} WHERE {quota_user} = %s"
    marks = ", ".join(["%s"] * states)
    limit = f"COALESCE(({own_limit.format(max_active)}), %s) + 1"
    capped = f"SELECT 1 FROM {job} WHERE {owner} = %s AND {state} IN ({marks}) LIMIT {limit}"
    return (
        f"SELECT ({own_limit.format(max_active)}), ({own_limit.format(max_mb)}), "
        f"(SELECT COUNT(*) FROM ({capped}) capped), SUM({checkpoints}), SUM({results}), SUM({work}) "
        f"FROM {job} WHERE {owner} = %s AND ({checkpoints} > 0 OR {results} > 0 OR {work} > 0)"
    )
