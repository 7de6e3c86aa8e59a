"""The tool's output relayed while it runs: each line of its stdout and stderr echoed to the job's
console and sent as a log event (its level guessed from the line's first word), and each JSON line
of its progress fd sent as a progress report or kept as an artifact's declaration."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import IO, Any

from controlplane_runner import events

Emit = Callable[[dict[str, Any]], None]  # takes one event (the reporter's `emit`)

LEVEL_PREFIXES = {
    "debug": events.DEBUG, "info": events.INFO, "warn": events.WARNING, "warning": events.WARNING,
    "error": events.ERROR, "critical": events.ERROR, "fatal": events.ERROR,
}


def level_of(line: str, stream: str) -> str:
    """The line's level: its first word when that names one ("WARN: ..." is warning), else info."""
    head = line.lstrip()[:10].lower()
    for prefix, level in LEVEL_PREFIXES.items():
        if head.startswith(prefix) and (len(head) == len(prefix) or not head[len(prefix)].isalpha()):
            return level
    return events.INFO


def relay_lines(pipe: IO[bytes], stream: str, echo: IO[str], emit: Emit) -> None:
    """Each line of `pipe` until it closes: written to `echo` and emitted as a log event."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        echo.write(line + "\n")  # the job's console shows the tool's output (cloud log sinks)
        echo.flush()
        emit(events.log(line, stream=stream, level=level_of(line, stream)))
    pipe.close()


def relay_progress(fd: int, emit: Emit, declared: dict[str, dict[str, Any]]) -> None:
    """Each JSON line of `fd` until it closes: an artifact's declaration (its kind and content
    type) goes into `declared` by name; any other object is emitted as a progress report of its
    PROGRESS_FIELDS that hold JSON scalars. Lines that are not JSON objects are skipped."""
    with os.fdopen(fd, "rb") as f:
        for raw in f:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("type") == "artifact":
                name = msg.get("name")
                if isinstance(name, str):
                    declared[name] = {k: msg[k] for k in ("kind", "content_type") if isinstance(msg.get(k), str)}
                continue
            report = {k: msg[k] for k in events.PROGRESS_FIELDS if k in msg and _scalar(msg[k])}
            if report:
                emit(events.progress(**report))


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)
