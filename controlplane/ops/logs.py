"""The server's log records on stderr: text for people, or one JSON object a line for a log store.

A record about a task carries `task_id`, `attempt`, `provider`, `action` (and `job_name` where
known) as fields (`extra=`, built by `of_attempt` / `of_job`); every record carries the `replica`
that wrote it once the server knows its name (`set_replica`). The text format shows only the
message, as it always has; the JSON format (`CONTROLPLANE_LOG_FORMAT=json`) shows every field, so
that one task's story can be filtered out of many replicas' lines.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pythonjsonlogger.json import JsonFormatter

from controlplane.ids import AttemptRef

LogFormat = Literal["text", "json"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries that give their loggers handlers of their own (fastmcp's rich console, uvicorn's
# default config): their records go through the server's one handler instead.
OWN_HANDLERS = ("fastmcp", "uvicorn", "uvicorn.error", "uvicorn.access", "mcp", "docket")
_replica: str | None = None
_json: logging.Handler | None = None  # the handler, while the format is JSON


class AttemptLike(Protocol):
    @property
    def task_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def provider(self) -> str: ...
    @property
    def job_name(self) -> str: ...


def of_attempt(ref: AttemptRef, action: str, **more: Any) -> dict[str, Any]:
    """The fields of a record about one attempt of a task (for `extra=`; `shard` for a shard's)."""
    fields: dict[str, Any] = {"task_id": ref.task_id, "attempt": ref.number, "action": action, **more}
    if ref.shard is not None:
        fields["shard"] = ref.shard
    return fields


def of_job(job: AttemptLike, action: str, **more: Any) -> dict[str, Any]:
    """The fields of a record about an attempt's job (a job or watched-job row)."""
    return of_attempt(AttemptRef(job.task_id, job.attempt), action, provider=job.provider, job_name=job.job_name, **more)


def set_replica(name: str) -> None:
    """Name this process (its lease holder name) in every record from now on."""
    global _replica
    _replica = name


class _Replica(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if _replica is not None and not hasattr(record, "replica"):
            record.replica = _replica
        return True


def formatter(log_format: LogFormat) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter("%(levelname)s %(name)s %(message)s", timestamp="time",  # ISO 8601, UTC
                             rename_fields={"levelname": "level", "name": "logger"})
    return logging.Formatter(TEXT)


def configure(level: str, log_format: LogFormat = "text") -> None:
    """One handler on stderr for every logger, in `log_format`, at `level` (a level name)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(_Replica())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    global _json
    _json = handler if log_format == "json" else None
    if _json is not None:  # nothing on stderr in another shape
        for name in OWN_HANDLERS:
            own = logging.getLogger(name)
            own.handlers.clear()
            own.propagate = True


def is_json() -> bool:
    """Whether the records are written as JSON (libraries must then not add handlers of their own)."""
    return _json is not None


def announce(text: str, say: Callable[[str], object]) -> None:
    """A line for the operator that no level hides ("serving MCP at ..."): `say(text)`, or in the
    JSON format a record of it (`action` "announce") through the one handler."""
    if _json is None:
        say(text)
        return
    record = logging.LogRecord("controlplane", logging.INFO, __file__, 0, text, None, None)
    record.action = "announce"
    _json.handle(record)
