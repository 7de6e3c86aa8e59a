"""Lenient reading of decoded JSON values: each function returns the value as the type asked for,
or None (a default) when it is not one, and never raises. Standard library only, like
`controlplane_runner.events`, whose parsers read every field through these.

Numbers must be finite (a number may also come as a string of one) and integers within a bound
the caller gives; texts have lone surrogates and NUL (U+0000, which PostgreSQL's text cannot
hold) replaced by U+FFFD, alike on every engine, and are cut to a limit the caller gives.
"""

from __future__ import annotations

import math
from typing import Any


def clean(s: str) -> str:
    """`s` as text every store keeps as it is: text that encodes to UTF-8 (lone surrogates become
    U+FFFD, and split pairs join), without NUL (U+FFFD too)."""
    if "\x00" in s:
        s = s.replace("\x00", "\ufffd")
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def as_text(v: Any, limit: int) -> str | None:
    """A text field: a string, or a number written out, cut to `limit` characters; anything else is None."""
    if isinstance(v, str):
        return clean(v[: limit * 2])[:limit]  # surrogate pairs may join: cut twice
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        try:
            return str(v)[:limit]
        except ValueError:  # more digits than int-to-str allows
            return None
    return None


def as_set_text(v: Any, limit: int) -> str | None:
    """A text field whose absence is any false value (None, "", 0), as `if outcome.get(...)` reads it."""
    return as_text(v, limit) if v else None


def as_message(v: Any) -> str:
    """A log line's text: whatever it is, written out ("" when missing); never cut here, the
    store cuts to its own limit."""
    if isinstance(v, str):
        return clean(v)
    if v is None:
        return ""
    try:
        return clean(str(v))
    except Exception:  # noqa: BLE001 - a huge int, a structure too deep to write out
        return ""


def as_tag(v: Any, default: str, limit: int) -> str:
    """A short name (a stream, a level) cut to `limit` characters; `default` when missing or empty."""
    text = as_text(v, limit)
    return text if text else default


def as_float(v: Any, bound: int) -> float | None:
    """A finite number (or a string of one), an integer only within +-bound; None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        if len(v) > 64:
            return None
        try:
            v = float(v)
        except ValueError:
            return None
    if isinstance(v, int):
        if not -bound <= v <= bound:
            return None
        return float(v)
    if isinstance(v, float) and math.isfinite(v):
        return v
    return None


def as_timestamp(v: Any, bound: int) -> float | None:
    """A time in seconds since the epoch; None when missing, not a finite number, or 0 (the
    store then uses its own clock, as `float(e.get("ts") or now)` did)."""
    f = as_float(v, bound)
    return f if f else None


def as_int(v: Any, bound: int) -> int | None:
    """An integer (or an integral float, or a string of one) within +-bound; None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        if len(v) > 24:
            return None
        try:
            v = int(v.strip())
        except ValueError:
            return None
    elif isinstance(v, float):
        if not (math.isfinite(v) and v.is_integer()):
            return None
        v = int(v)
    if isinstance(v, int) and -bound <= v <= bound:
        return int(v)
    return None
