"""How clockq's pages write dates, durations, params and errors: one way each, everywhere.

- `when`: an instant as `2026-12-02 19:09:56` (`when:"ms"` adds milliseconds), in the server's
  `TIME_ZONE` (named in its title) inside a `<time>` element; clockq has no per-user time zone,
  so base.html's script (static/webapp/local_time.js) rewrites it in the browser's own.
- `duration`: milliseconds as a person reads them: 250 ms, 1.5 s, 1 min 30 s, 2 h 5 min.
- `pretty_json`: params and other JSON values indented, as JSON (not Python's repr).
- `error_line`: a traceback in one line, its last (the exception), without server paths.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
ERROR_LINE_CHARS = 300
PRETTY_JSON_ONE_LINE = 80
# An absolute path of two or more parts ("/srv/clockq/var/ckpt/12/gen-3.ckpt"); a lone "/x" is
# more likely a ratio or a URL path than a place on the server.
_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)+([\w.@+-]+)")


@register.filter(is_safe=True)
def when(value: datetime | None, precision: str = "s"):
    """`2026-12-02 19:09:56` in `<time datetime="...">`; "" for None (so `|default:` works)."""
    if value is None or value == "":
        return ""
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    text = value.strftime(DATE_FORMAT)
    if precision == "ms":
        text += f".{value.microsecond // 1000:03d}"
    zone = timezone.get_current_timezone_name() if timezone.is_aware(value) else ""
    iso = value.isoformat(timespec="milliseconds")
    return format_html('<time datetime="{}" data-precision="{}" title="{}">{}</time>', iso, precision, zone, text)


@register.filter
def duration(ms: float | int | None) -> str:
    """Milliseconds for people: 250 ms, 0.4 ms, 1.5 s, 12 s, 1 min, 1 min 30 s, 2 h 5 min, 3 d 4 h."""
    if ms is None or ms == "":
        return ""
    ms = float(ms)
    if not math.isfinite(ms):
        return str(ms)
    if ms < 0:
        return "-" + duration(-ms)
    if ms < 9.95:
        return f"{_trim(ms, 1)} ms"
    if round(ms) < 1000:
        return f"{round(ms)} ms"
    if ms < 9950:
        return f"{_trim(ms / 1000, 1)} s"
    seconds = round(ms / 1000)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 10:
        return f"{minutes} min" + (f" {seconds} s" if seconds else "")
    minutes += round(seconds / 60)
    hours, minutes = divmod(minutes, 60)
    if not hours:
        return f"{minutes} min"
    if hours < 24:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    hours += round(minutes / 60)
    days, hours = divmod(hours, 24)
    return f"{days} d" + (f" {hours} h" if hours else "")


def _trim(number: float, places: int) -> str:
    """`number` with at most `places` decimals, without a trailing `.0`."""
    text = f"{number:.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


@register.filter
def pretty_json(value) -> str:
    """A JSON value as JSON (`{"steps": 10}`, not `{'steps': 10}`): on one line while it is short,
    indented when longer. Escaped on output like any text."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= PRETTY_JSON_ONE_LINE else json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def error_line(error: str | None) -> str:
    """A job's last error in one line: the last non-empty one (a traceback ends with the
    exception), with each absolute path cut to its last part."""
    lines = [line.strip() for line in (error or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = _PATH.sub(r"…/\1", lines[-1])
    return line if len(line) <= ERROR_LINE_CHARS else line[: ERROR_LINE_CHARS - 1] + "…"
