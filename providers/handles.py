"""Handles: a launched job as its provider finds it again, stored by the control plane as JSON.

The encoded form is the stored format: a field is never renamed, and a new one has a default, so
that rows written by an earlier version still decode.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Self, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import from_json

from controlplane_providers.errors import MalformedHandle


@dataclass(frozen=True)
class Handle:
    """A launched job, as its provider finds it again: a frozen dataclass of JSON values.

    `encode()` is what the control plane stores; `decode(stored)` rebuilds the handle, checking
    every field's type (pydantic), ignoring keys it does not know and giving absent fields their
    defaults, so rows written by earlier versions still decode. A field declared with
    `omitted_if_none()` is left out of the encoding while it is None (the stored form of earlier
    versions did not have the key)."""

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omitted_if_none"):
                continue
            out[f.name] = value
        return out

    @classmethod
    def decode(cls, data: dict[str, Any] | str) -> Self:
        """`data` is the stored form: the JSON text (parsed and checked in one pass, which is what
        the reconciler does for every watched job each cycle) or its parsed dict."""
        try:
            if isinstance(data, str):
                return _adapter(cls).validate_json(data)
            if not isinstance(data, dict):
                raise MalformedHandle(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
            return _adapter(cls).validate_python(data)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(handle)'}: {err['msg']}"
                                 for err in e.errors())
            raise MalformedHandle(f"malformed {cls.__name__} {_clip(data)}: {problems}") from None

    @classmethod
    def decode_many(cls, texts: Sequence[str]) -> list[Self]:
        """Stored handles (JSON text) decoded together, in order: what the reconciler does for a
        page of watched jobs each cycle. Each text is parsed on its own and all are checked in one
        pydantic pass (one `decode` call each costs about three times as much). MalformedHandle
        if any text is not one handle (`decode` each of them to tell which)."""
        try:
            parsed = [from_json(t) for t in texts]
            if set(map(type, parsed)) <= {dict}:
                return _list_adapter(cls).validate_python(parsed)
        except (ValueError, ValidationError):
            pass
        raise MalformedHandle(f"not every one of {len(texts)} texts is a {cls.__name__}")


def omitted_if_none(default: Any = None) -> Any:
    """A handle field that stays out of `encode()` while it is None."""
    return field(default=default, metadata={"omitted_if_none": True})


HandleT = TypeVar("HandleT", bound=Handle)


def _adapter(cls: type[HandleT]) -> TypeAdapter[HandleT]:
    """The pydantic check of one handle class (made once per class)."""
    # (the ignore: a class is hashable, but mypy reads a dataclass's __hash__ as the class's)
    adapter: TypeAdapter[HandleT] = _adapters(cls)  # type: ignore[arg-type]
    return adapter


def _list_adapter(cls: type[HandleT]) -> TypeAdapter[list[HandleT]]:
    """The pydantic check of a list of one handle class (made once per class)."""
    adapter: TypeAdapter[list[HandleT]] = _list_adapters(cls)  # type: ignore[arg-type]  # as in _adapter
    return adapter


@functools.cache
def _adapters(cls: type[Handle]) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


@functools.cache
def _list_adapters(cls: type[Handle]) -> TypeAdapter[Any]:
    return TypeAdapter(list[cls])  # type: ignore[valid-type]


def _clip(data: Any, n: int = 200) -> str:
    text = repr(data)
    return text if len(text) <= n else text[: n - 3] + "..."
