"""What a client's raw input must pass before any code reads it, on every way in.

The API's JSON bodies and the web form's posts are read here, and then checked by the same
walk, so one bad input gets one answer wherever it comes in:

- text is UTF-8 and storable: invalid UTF-8 is decoded with `surrogateescape`, so it arrives as
  the same lone surrogates a JSON escape (`"\\ud800"`) can spell, and both are refused with NUL
  (PostgreSQL refuses it). This is checked before anything echoes the text back: an error
  page or message holding a lone surrogate fails in turn when it is encoded;
- nothing nests deeper than MAX_DEPTH (the walk is iterative, so depth cannot overflow it);
- no field or key is given twice: Django keeps the last of two form fields and `json` the last
  of two keys, so a reader would see one value where a check might have seen another.

A refusal names the top-level field it concerns.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32
UNSTORABLE = "holds text that cannot be stored (invalid UTF-8, a lone surrogate or NUL)"


class InputRefused(ValueError):
    """A client's input refused as a whole; str() says why and names the field, `field` is its
    top-level field (None for the body itself)."""

    def __init__(self, field: str | None, reason: str):
        where = "the body" if field is None else f"field {field!r}"  # repr: shows a surrogate escaped
        super().__init__(f"{where} {reason}")
        self.field = field


class _DuplicatedKeys(dict):
    """An object that named `key` more than once; check() refuses it with the field it is in."""

    key: Any


def object_from_pairs(pairs: list[tuple[Any, Any]]) -> dict:
    """A dict of (key, value) pairs that remembers a key given twice (json's object_pairs_hook)."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    duplicated = _DuplicatedKeys(obj)
    seen: set = set()
    for key, _value in pairs:
        if key in seen:
            duplicated.key = key
            break
        seen.add(key)
    return duplicated


def loads(raw: bytes | str, *, field: str | None = None) -> Any:
    """JSON from a client, checked: a whole body, or with `field`, the text of one field of a
    submission (the web form's params), whose depth counts from the submission around it."""
    text = raw.decode("utf-8", "surrogateescape").removeprefix("\ufeff") if isinstance(raw, bytes) else raw
    outer = 0 if field is None else 1
    try:
        data = json.loads(text, object_pairs_hook=object_from_pairs)
    except RecursionError:  # json nests through the C stack: far deeper than MAX_DEPTH
        raise InputRefused(field or _too_deep_field(text), f"is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise InputRefused(field, f"is not valid JSON: {str(exc)[:200]}") from None
    check(data, field=field, depth=outer + 1)
    return data


def check(data: Any, *, field: str | None = None, depth: int = 1) -> None:
    """Raise InputRefused for nesting beyond MAX_DEPTH, text that cannot be stored or a key given
    twice anywhere in `data`, a body (at depth 1) or the value of `field`."""
    stack: list[tuple[Any, int, str | None]] = [(data, depth, field)]  # (value, depth, top-level field)
    while stack:
        item, depth, field = stack.pop()
        if isinstance(item, str):
            if not storable(item):
                raise InputRefused(field, UNSTORABLE)
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise InputRefused(field, f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, list):
            stack.extend((value, depth + 1, field) for value in item)
            continue
        if isinstance(item, _DuplicatedKeys):
            if field is None:
                raise InputRefused(item.key, "is given more than once")
            raise InputRefused(field, f"holds the key {item.key!r} more than once")
        for key, value in item.items():
            if not storable(key):
                if field is None:
                    raise InputRefused(None, f"has a field name that {UNSTORABLE}")
                raise InputRefused(field, f"has a key that {UNSTORABLE}")
            stack.append((value, depth + 1, key if field is None else field))


def storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Strings (possessive, so an unterminated one is read once, not once per quote) and structure.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.?)*+"?|[\[\]{}:]', re.S)


def _too_deep_field(text: str) -> str | None:
    """The top-level field of a JSON body whose value nests deeper than MAX_DEPTH, for the error
    only (json.loads gave up with the stack and says nothing of where)."""
    depth, last, field = 0, None, None
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                return field
        elif token in ("]", "}"):
            depth -= 1
        elif token == ":":
            if depth == 1 and last is not None:
                try:
                    field = json.loads(last)
                except ValueError:
                    field = None
        else:
            last = token
    return None
