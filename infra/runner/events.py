"""The runner's events: the one written definition of what a job reports to the control plane.

The runner builds every event with the builders below; the control plane reads them with
`parse` (events) and `parse_outcome` (`result.json`), each field read through
`controlplane_runner.coercion`. Standard library only (this module and that one): both are copied
into every job image with the rest of `infra/runner/`.

Every event is a JSON object with

    type   str     "log" | "progress" | "started" | "finished"              (LOG, PROGRESS, ...)
    seq    int     the event's number within the attempt (rules below)
    ts     float   when the runner made it, seconds since the epoch

and, by type:

log       one line of the tool's stdout or stderr, or a note of the runner's own
    stream     str    "stdout" | "stderr"                                      (STREAMS)
    level      str    "debug" | "info" | "warning" | "error" (LEVELS), guessed from the line's
                      first word ("WARN: ..." is "warning"; see relay.level_of)
    message    str    the line without its line ending, cut to MAX_MESSAGE characters
    truncated  true   present only when the line was cut

progress  the tool's latest report (the runner relays what the tool writes to its progress fd,
          keeping the PROGRESS_FIELDS whose values are JSON scalars, null included; each field
          is optional, and the parser reads null or a value of the wrong type as not given)
    percent     number   0 to 100
    step        int      steps done ...
    step_total  int      ... of this many
    phase       str      what the tool is doing ("relax", "md")
    message     str      free text
    eta_s       number   the tool's own estimate of the seconds left

started   the tool's process has started
    pid        int    its process id (inside the job)
    job_name   str    the job's name as the runner was told it (may be "")

finished  the attempt's outcome; always the last event of an attempt
    status       str           "succeeded" | "failed" | "cancelled"                 (STATUSES)
                               succeeded: exit code 0 and no error; cancelled: the runner was
                               asked to stop (stop_reason says why), whatever the tool's exit
    exit_code    int | null    the tool's exit code, 128 + n when killed by signal n;
                               127 when the tool could not be started; null when it never ran
    signal       str | null    the name of the signal that killed the tool ("SIGKILL")
    error        str | null    what went wrong outside the tool's exit code: inputs that could
                               not be read (exactly INPUTS_UNREADABLE: why is in a log line
                               before it), a stop before the start, a result file that is not
                               a JSON object; with exit_code null: the tool never ran
    stop_reason  str | null    why the runner stopped the tool (STOP_REASONS): "cancel" (the
                               callback answered cancel: true), "stale" (the callback answered
                               409: the attempt is no longer current), "signal" (SIGTERM or
                               SIGINT reached the runner: the job was stopped from outside)
    result       object | null the tool's result file (a JSON object), if it wrote one
    artifacts    [object]      the files uploaded from the artifacts directory, each
                               {name, kind, key, size_bytes, sha256, content_type} (`artifact`)
    started_at   float         when the runner started, seconds since the epoch
    finished_at  float         when the outcome was made

A consumer ignores fields it does not know, and events of a type it does not know.

Sequence numbers. `seq` is per attempt: the first event of an attempt is 1 and each next one is
the previous + 1, with no gaps (the runner numbers events as they leave its queue, after it
coalesced progress reports, so a dropped report never leaves a hole). An event keeps its seq
wherever it goes: a batch re-sent after a lost answer, or written to the object store and also
delivered by callback, carries the same events under the same numbers. The control plane applies
each seq once (events at or below the highest seq it applied are skipped) and only in order (a
batch that starts past the next seq makes it read the missing ones from the object store first).

Delivery (see `controlplane_runner.reporter`): batches are POSTed as {"events": [event, ...]} to the
callback; events the callback did not take are written to the object store as chunks, and the
outcome document is written there too. The object-store layout (`controlplane.objectstore.base`):

    tasks/<task_id>/attempts/<attempt>/events/<first seq, 12 digits>.jsonl   events_key()
        one event per line, ascending contiguous seqs; chunks may repeat events the callback
        also delivered
    tasks/<task_id>/attempts/<attempt>/result.json                             result_key()
        the outcome document (`outcome`): the `finished` event's fields without type, seq and ts
    tasks/<task_id>/attempts/<attempt>/artifacts/<name>                        artifact_key()

The runner's --exit-file (read by the local provider) holds the same outcome document.

Parsing is lenient and never raises: a value of the wrong type is dropped (or its field takes
its default); numbers must be finite (a number may also come as a string of one), integers
within +-2**53 (seq: 1 to 2**63-1, else 0); texts have lone surrogates and NUL (U+0000, which
PostgreSQL's text cannot hold) replaced by U+FFFD, alike on every engine; stream and level are
cut to 8 characters (as the store keeps them), other texts to MAX_TEXT, and a log message is
not cut here (the store cuts it to its own limit). The contents of `result` and of each artifact
entry are not checked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from controlplane_runner.coercion import as_float, as_int, as_message, as_set_text, as_tag, as_text, as_timestamp

# ---- names -----------------------------------------------------------------------------------
LOG = "log"
PROGRESS = "progress"
STARTED = "started"
FINISHED = "finished"
TYPES = frozenset({LOG, PROGRESS, STARTED, FINISHED})

SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
STATUSES = frozenset({SUCCEEDED, FAILED, CANCELLED})

STOP_CANCEL = "cancel"
STOP_STALE = "stale"
STOP_SIGNAL = "signal"
STOP_REASONS = frozenset({STOP_CANCEL, STOP_STALE, STOP_SIGNAL})

# The error of an attempt whose inputs or input files could not be read before the tool started;
# the reason (the exception) goes only into a log line, never into the outcome the client sees.
INPUTS_UNREADABLE = "cannot read inputs"

STDOUT = "stdout"
STDERR = "stderr"
STREAMS = frozenset({STDOUT, STDERR})

DEBUG = "debug"
INFO = "info"
WARNING = "warning"
ERROR = "error"
LEVELS = frozenset({DEBUG, INFO, WARNING, ERROR})

PROGRESS_FIELDS = ("percent", "step", "step_total", "phase", "message", "eta_s")
OUTCOME_FIELDS = ("status", "exit_code", "signal", "error", "stop_reason", "result", "artifacts",
                  "started_at", "finished_at")

MAX_MESSAGE = 16 * 1024  # characters of a log line the runner sends; the rest is cut (truncated: true)
MAX_TAG = 8  # characters of stream and level the control plane keeps
MAX_TEXT = 16 * 1024  # characters kept of a parsed progress text, error, status, signal, job name
MAX_INT = 2**53  # larger integers (in magnitude) are not kept: JSON readers lose them
MAX_SEQ = 2**63 - 1


# ---- builders (the runner's side) -------------------------------------------------------------
def _event(kind: str, fields: dict[str, Any], seq: int | None, ts: float | None) -> dict[str, Any]:
    event = {"type": kind, **fields, "ts": time.time() if ts is None else ts}
    if seq is not None:
        event["seq"] = seq
    return event


def number(event: dict[str, Any], seq: int) -> dict[str, Any]:
    """Give `event` its sequence number (the reporter does, as the event leaves its queue)."""
    event["seq"] = seq
    return event


def log(message: str, *, stream: str = STDOUT, level: str = INFO,
        seq: int | None = None, ts: float | None = None) -> dict[str, Any]:
    """A log line; one longer than MAX_MESSAGE characters is cut and marked truncated."""
    fields: dict[str, Any] = {"stream": stream, "level": level, "message": message[:MAX_MESSAGE]}
    if len(message) > MAX_MESSAGE:
        fields["truncated"] = True
    return _event(LOG, fields, seq, ts)


def progress(*, seq: int | None = None, ts: float | None = None, **fields: Any) -> dict[str, Any]:
    """A progress report of the given PROGRESS_FIELDS (percent, step, step_total, phase,
    message, eta_s), kept as given."""
    unknown = set(fields) - set(PROGRESS_FIELDS)
    if unknown:
        raise TypeError(f"progress fields are {', '.join(PROGRESS_FIELDS)}; not {', '.join(sorted(unknown))}")
    return _event(PROGRESS, fields, seq, ts)


def started(*, pid: int | None, job_name: str | None, seq: int | None = None,
            ts: float | None = None) -> dict[str, Any]:
    return _event(STARTED, {"pid": pid, "job_name": job_name}, seq, ts)


def artifact(*, name: str, kind: str, key: str, size_bytes: int, sha256: str,
             content_type: str) -> dict[str, Any]:
    """One entry of an outcome's `artifacts`."""
    return {"name": name, "kind": kind, "key": key, "size_bytes": size_bytes, "sha256": sha256,
            "content_type": content_type}


def outcome(*, status: str, exit_code: int | None, signal: str | None, error: str | None,
            stop_reason: str | None, result: dict[str, Any] | None, artifacts: list[dict[str, Any]],
            started_at: float, finished_at: float) -> dict[str, Any]:
    """The outcome document: `result.json` in the object store, and the runner's --exit-file."""
    return {"status": status, "exit_code": exit_code, "signal": signal, "error": error,
            "stop_reason": stop_reason, "result": result, "artifacts": artifacts,
            "started_at": started_at, "finished_at": finished_at}


def finished(*, status: str, exit_code: int | None, signal: str | None, error: str | None,
             stop_reason: str | None, result: dict[str, Any] | None, artifacts: list[dict[str, Any]],
             started_at: float, finished_at: float, seq: int | None = None,
             ts: float | None = None) -> dict[str, Any]:
    """The `finished` event: the outcome document as an event (`finished(**outcome(...))`)."""
    doc = outcome(status=status, exit_code=exit_code, signal=signal, error=error, stop_reason=stop_reason,
                  result=result, artifacts=artifacts, started_at=started_at, finished_at=finished_at)
    return _event(FINISHED, doc, seq, ts)


# ---- parsed events (the control plane's side) -------------------------------------------------
@dataclass(frozen=True, slots=True)
class Log:
    type: ClassVar[str] = LOG
    seq: int = 0
    ts: float | None = None
    message: str = ""
    stream: str = STDOUT
    level: str = INFO
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Progress:
    type: ClassVar[str] = PROGRESS
    seq: int = 0
    ts: float | None = None
    percent: float | None = None
    step: int | None = None
    step_total: int | None = None
    phase: str | None = None
    message: str | None = None
    eta_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields the report has (None: it has not), without seq and ts."""
        values = (self.percent, self.step, self.step_total, self.phase, self.message, self.eta_s)
        return {k: v for k, v in zip(PROGRESS_FIELDS, values, strict=True) if v is not None}


@dataclass(frozen=True, slots=True)
class Started:
    type: ClassVar[str] = STARTED
    seq: int = 0
    ts: float | None = None
    pid: int | None = None
    job_name: str | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """A `finished` event, or the outcome document (`parse_outcome`: seq 0, ts None).
    status, signal, error and stop_reason are None when false ("" or 0), as decide() reads them."""
    type: ClassVar[str] = FINISHED
    seq: int = 0
    ts: float | None = None
    status: str | None = None  # one of STATUSES as the runner sends it; any other text is kept
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    stop_reason: str | None = None
    result: dict[str, Any] | None = None  # only a JSON object; its contents are not checked
    artifacts: tuple[dict[str, Any], ...] = ()  # the entries that are objects, unchecked otherwise
    started_at: float | None = None
    finished_at: float | None = None

    def as_outcome(self) -> dict[str, Any]:
        """The outcome as a document of OUTCOME_FIELDS (artifacts as a list)."""
        return {"status": self.status, "exit_code": self.exit_code, "signal": self.signal, "error": self.error,
                "stop_reason": self.stop_reason, "result": self.result, "artifacts": list(self.artifacts),
                "started_at": self.started_at, "finished_at": self.finished_at}


Event = Log | Progress | Started | Finished


def seq_of(obj: Any) -> int:
    """The event's sequence number; 0 when it is missing or not a number from 1 to MAX_SEQ."""
    if not isinstance(obj, dict):
        return 0
    n = as_int(obj.get("seq"), MAX_SEQ)
    return n if n is not None and n > 0 else 0


def parse(obj: Any) -> Event | None:
    """The event `obj` (a decoded JSON value) describes; None for anything that is not an object
    with a known `type`. Never raises. seq is 0 when missing or bad (see `seq_of`)."""
    if not isinstance(obj, dict):
        return None
    kind = obj.get("type")
    if not isinstance(kind, str):
        return None
    seq = seq_of(obj)
    ts = as_timestamp(obj.get("ts"), MAX_INT)
    if kind == LOG:
        return Log(seq=seq, ts=ts, message=as_message(obj.get("message")),
                   stream=as_tag(obj.get("stream"), STDOUT, MAX_TAG),
                   level=as_tag(obj.get("level"), INFO, MAX_TAG), truncated=obj.get("truncated") is True)
    if kind == PROGRESS:
        return Progress(seq=seq, ts=ts, percent=as_float(obj.get("percent"), MAX_INT),
                        step=as_int(obj.get("step"), MAX_INT), step_total=as_int(obj.get("step_total"), MAX_INT),
                        phase=as_text(obj.get("phase"), MAX_TEXT), message=as_text(obj.get("message"), MAX_TEXT),
                        eta_s=as_float(obj.get("eta_s"), MAX_INT))
    if kind == STARTED:
        return Started(seq=seq, ts=ts, pid=as_int(obj.get("pid"), MAX_INT),
                       job_name=as_text(obj.get("job_name"), MAX_TEXT))
    if kind == FINISHED:
        return _finished(obj, seq, ts)
    return None


def parse_outcome(obj: Any) -> Finished | None:
    """The outcome document (`result.json`, or a `finished` event); None when `obj` is not a JSON
    object. A document without a status parses with status None (the attempt failed). Never raises."""
    if not isinstance(obj, dict):
        return None
    return _finished(obj, seq_of(obj), as_timestamp(obj.get("ts"), MAX_INT))


def _finished(obj: dict[str, Any], seq: int, ts: float | None) -> Finished:
    result = obj.get("result")
    artifacts = obj.get("artifacts")
    return Finished(
        seq=seq, ts=ts, status=as_set_text(obj.get("status"), MAX_TEXT),
        exit_code=as_int(obj.get("exit_code"), MAX_INT), signal=as_set_text(obj.get("signal"), MAX_TEXT),
        error=as_set_text(obj.get("error"), MAX_TEXT), stop_reason=as_set_text(obj.get("stop_reason"), MAX_TEXT),
        result=result if isinstance(result, dict) else None,
        artifacts=tuple(a for a in artifacts if isinstance(a, dict)) if isinstance(artifacts, list) else (),
        started_at=as_float(obj.get("started_at"), MAX_INT),
        finished_at=as_float(obj.get("finished_at"), MAX_INT),
    )
