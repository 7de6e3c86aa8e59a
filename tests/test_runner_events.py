"""The runner's event format (`infra/runner/events.py`): what the builders make parses back to the
same values; the parser takes anything without raising and hands on only bounded, finite, encodable
values; the real runner writes nothing the parser does not know; the module needs only the
standard library (it and the coercion it reads fields through ship in every job image)."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import artifact_key, events_prefix, inputs_key, result_key
from controlplane.objectstore.claim import claim_key
from controlplane.objectstore.local import LocalObjectStore
from controlplane_runner import events
from tests.conftest import ROOT
from tests.test_runner_image import copies

EVENTS_PY = ROOT / "infra" / "runner" / "events.py"
# events.py and the one module of the runner it imports: together they need nothing else.
EVENT_MODULES = [EVENTS_PY, ROOT / "infra" / "runner" / "coercion.py"]

# The fields the module's docstring lists, per type: the runner sends no others.
DOCUMENTED = {
    events.LOG: {"stream", "level", "message", "truncated"},
    events.PROGRESS: set(events.PROGRESS_FIELDS),
    events.STARTED: {"pid", "job_name"},
    events.FINISHED: set(events.OUTCOME_FIELDS),
}
COMMON = {"type", "seq", "ts"}
ARTIFACT_FIELDS = {"name", "kind", "key", "size_bytes", "sha256", "content_type"}


def wire(event: dict[str, Any]) -> Any:
    """The event as the other side receives it (a JSON line, or a JSON batch)."""
    return json.loads(json.dumps(event))


# ---- round trip -------------------------------------------------------------------------------
def test_log_round_trip() -> None:
    e = events.log("WARN: low memory", stream=events.STDERR, level=events.WARNING, seq=4, ts=1700000000.5)
    assert e == {"type": "log", "stream": "stderr", "level": "warning", "message": "WARN: low memory",
                 "ts": 1700000000.5, "seq": 4}
    assert events.parse(wire(e)) == events.Log(seq=4, ts=1700000000.5, message="WARN: low memory",
                                               stream="stderr", level="warning", truncated=False)
    assert events.seq_of(wire(e)) == 4


def test_log_cuts_a_long_line_and_says_so() -> None:
    e = events.log("é" * (events.MAX_MESSAGE + 1), seq=1)
    assert e["truncated"] is True and len(e["message"]) == events.MAX_MESSAGE
    parsed = events.parse(wire(e))
    assert isinstance(parsed, events.Log)
    assert parsed.truncated and parsed.message == "é" * events.MAX_MESSAGE
    assert parsed.stream == events.STDOUT and parsed.level == events.INFO  # the builder's defaults
    assert "truncated" not in events.log("x" * events.MAX_MESSAGE)


def test_log_gets_a_time_when_none_is_given() -> None:
    e = events.log("x")
    assert isinstance(e["ts"], float) and "seq" not in e
    assert events.parse(e).ts == e["ts"] and events.parse(e).seq == 0


@pytest.mark.parametrize("fields", [
    {"percent": 12.5},
    {"step": 3, "step_total": 10, "phase": "relax", "message": "E=-12.3", "eta_s": 4.25, "percent": 30},
    {"phase": "", "message": "only words"},
    {},
])
def test_progress_round_trip(fields: dict[str, Any]) -> None:
    e = events.progress(**fields, seq=2, ts=1.0)
    assert e == {"type": "progress", **fields, "ts": 1.0, "seq": 2}
    parsed = events.parse(wire(e))
    assert isinstance(parsed, events.Progress) and (parsed.seq, parsed.ts) == (2, 1.0)
    assert parsed.as_dict() == fields
    assert all(getattr(parsed, k) == v for k, v in fields.items())


def test_progress_takes_only_its_fields() -> None:
    with pytest.raises(TypeError):
        events.progress(percent=1, pct=2)


def test_started_round_trip() -> None:
    e = events.started(pid=4242, job_name="cp-t1-a1", seq=1, ts=2.0)
    assert events.parse(wire(e)) == events.Started(seq=1, ts=2.0, pid=4242, job_name="cp-t1-a1")
    assert events.parse(wire(events.started(pid=1, job_name=""))).job_name == ""


OUTCOMES = [
    dict(status=events.SUCCEEDED, exit_code=0, signal=None, error=None, stop_reason=None,
         result={"energy": -12.3, "atoms": [1, 2]}, started_at=10.0, finished_at=12.5,
         artifacts=[events.artifact(name="opt.xyz", kind="trajectory", key="tasks/t/attempts/1/artifacts/opt.xyz",
                                    size_bytes=120, sha256="a" * 64, content_type="chemical/x-xyz")]),
    dict(status=events.FAILED, exit_code=3, signal=None, error="the tool's result must be a JSON object",
         stop_reason=None, result=None, artifacts=[], started_at=10.0, finished_at=11.0),
    dict(status=events.FAILED, exit_code=None, signal=None, error="cannot read inputs: boom", stop_reason=None,
         result=None, artifacts=[], started_at=10.0, finished_at=10.1),
    dict(status=events.CANCELLED, exit_code=143, signal="SIGTERM", error=None, stop_reason=events.STOP_CANCEL,
         result=None, artifacts=[], started_at=10.0, finished_at=20.0),
]


@pytest.mark.parametrize("doc", OUTCOMES, ids=lambda d: f"{d['status']}-{d['exit_code']}")
def test_finished_and_result_json_round_trip(doc: dict[str, Any]) -> None:
    outcome = events.outcome(**doc)
    assert outcome == doc and set(outcome) == set(events.OUTCOME_FIELDS)
    e = events.finished(**outcome, seq=7, ts=3.0)
    assert e == {"type": "finished", **doc, "ts": 3.0, "seq": 7}
    parsed = events.parse(wire(e))
    assert isinstance(parsed, events.Finished) and (parsed.seq, parsed.ts) == (7, 3.0)
    assert parsed.as_outcome() == doc
    from_store = events.parse_outcome(wire(outcome))  # result.json: no type, seq or ts
    assert from_store == dataclasses.replace(parsed, seq=0, ts=None)
    assert events.parse_outcome(wire(e)) == parsed  # a finished event reads as an outcome too


def test_names() -> None:
    assert events.TYPES == {"log", "progress", "started", "finished"}
    assert events.STATUSES == {"succeeded", "failed", "cancelled"}
    assert events.STOP_REASONS == {"cancel", "stale", "signal"}
    assert all(len(x) <= events.MAX_TAG for x in events.STREAMS | events.LEVELS)
    for cls, kind in [(events.Log, "log"), (events.Progress, "progress"), (events.Started, "started"),
                      (events.Finished, "finished")]:
        assert cls.type == kind and cls().type == kind
    with pytest.raises(dataclasses.FrozenInstanceError):
        events.Log().seq = 3  # type: ignore[misc]


# ---- leniency ---------------------------------------------------------------------------------
def test_what_is_not_an_event() -> None:
    for obj in (None, 1, "log", [{"type": "log"}], {"type": "heartbeat", "seq": 1}, {"seq": 1},
                {"type": ["log"]}, {"type": {"log": 1}}, {"type": None}, {"type": "LOG"}):
        assert events.parse(obj) is None, obj
    for obj in (None, [], "result", 3):
        assert events.parse_outcome(obj) is None


@pytest.mark.parametrize("seq,expected", [
    (1, 1), (42, 42), ("7", 7), (" 8 ", 8), (5.0, 5), (5.5, 0), (0, 0), (-3, 0), (True, 0), (None, 0),
    ("x", 0), ([1], 0), (float("nan"), 0), (float("inf"), 0), (2**63 - 1, 2**63 - 1), (2**63, 0),
    (10**400, 0), ("9" * 400, 0),
])
def test_seq_of(seq: Any, expected: int) -> None:
    assert events.seq_of({"type": "log", "seq": seq}) == expected
    parsed = events.parse({"type": "log", "seq": seq})
    assert parsed is not None and parsed.seq == expected


def test_seq_of_what_has_none() -> None:
    assert events.seq_of({}) == 0 and events.seq_of([]) == 0 and events.seq_of(None) == 0


def test_hostile_examples() -> None:
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    log = events.parse({"type": "log", "message": "a\ud800b\udfff", "stream": "x" * 50, "level": ["error"],
                        "ts": float("nan"), "truncated": "yes"})
    assert log == events.Log(message="a\ufffdb\ufffd", stream="x" * 8, level="info")
    assert events.parse({"type": "log", "message": "\ud83d\ude00"}).message == "\U0001F600"  # a split pair joins
    nul = events.parse({"type": "log", "message": "a\x00b", "stream": "std\x00out", "level": "\x00"})
    assert nul == events.Log(message="a\ufffdb", stream="std\ufffdout", level="\ufffd")  # stored alike on every engine
    assert events.parse({"type": "progress", "message": "\x00é"}).as_dict() == {"message": "\ufffdé"}
    assert events.parse_outcome({"status": "failed", "error": "no\x00pe"}).error == "no\ufffdpe"
    assert events.parse({"type": "log", "message": 10**5000}).message == ""
    assert events.parse({"type": "log", "message": nested}).message == ""
    assert events.parse({"type": "log", "message": 3.5}).message == "3.5"
    assert events.parse({"type": "log", "message": None, "stream": None, "level": ""}) == events.Log()
    assert events.parse({"type": "log", "ts": 0}).ts is None  # the store's clock then, as `ts or now`
    assert events.parse({"type": "log", "ts": "1700000000.25"}).ts == 1700000000.25

    progress = events.parse({"type": "progress", "percent": float("inf"), "step": 10**5000, "step_total": 2.5,
                             "phase": {"a": 1}, "message": "\udc80" * 3, "eta_s": "nan", "junk": 1})
    assert progress.as_dict() == {"message": "\ufffd" * 3}
    progress = events.parse({"type": "progress", "percent": "50", "step": "3", "step_total": 10.0, "eta_s": -0.0,
                             "phase": 7, "message": "m" * (events.MAX_TEXT + 10)})
    assert progress.as_dict() == {"percent": 50.0, "step": 3, "step_total": 10, "eta_s": -0.0, "phase": "7",
                                  "message": "m" * events.MAX_TEXT}
    assert events.parse({"type": "progress", "percent": True, "step": 2**53 + 1}).as_dict() == {}

    started = events.parse({"type": "started", "pid": "12", "job_name": ["x"]})
    assert started == events.Started(pid=12)

    fin = events.parse_outcome({"status": 0, "exit_code": "1", "signal": "", "error": 0, "stop_reason": [],
                                "result": [1], "artifacts": [{"name": "a"}, "b", None, 3], "started_at": "x",
                                "finished_at": 10**400})
    assert fin == events.Finished(exit_code=1, artifacts=({"name": "a"},))
    assert events.parse_outcome({}) == events.Finished()  # no status: the attempt failed
    assert events.parse_outcome({"artifacts": {"name": "a"}, "result": "ok", "exit_code": True}) == events.Finished()
    assert events.parse_outcome({"status": "lost", "error": 5}).as_outcome()["status"] == "lost"
    assert events.parse_outcome({"error": 5}).error == "5"


HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 7, 2**31, 2**53, 2**53 + 1, 2**63, -(2**63) - 1, 10**400, 10**5000,
    0.0, -0.0, 1.5, 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"),
    "", "x", "stdout", "stderr", "warning", "succeeded", "cancelled", "SIGKILL", "7", " 12 ", "1e999", "nan",
    "-inf", "9" * 5000, "\ud800", "a\udfffb", "\ud83d\ude00", "\x00", "é" * 40_000, "x" * 100_000,
    [], {}, [1, 2], {"a": float("nan")}, [{"name": "a"}], [None, "x", {}], {"type": "log"},
    b"bytes", 1 + 2j, object(),
]
FIELD_NAMES = sorted(set().union(*DOCUMENTED.values(), COMMON, ARTIFACT_FIELDS) | {"other", ""})


def hostile_objects(rng: random.Random, n: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        obj: dict[Any, Any] = {k: rng.choice(HOSTILE) for k in rng.sample(FIELD_NAMES, rng.randint(0, 12))}
        obj["type"] = rng.choice([*events.TYPES, *events.TYPES, "other", None, 3, ["log"], {}])
        if rng.random() < 0.1:
            obj[rng.choice([1, None, ("t",), 2.5])] = "odd key"
        out.append(obj)
    return out + HOSTILE


def _text_ok(v: Any, limit: int | None = None, *, empty: bool = True) -> bool:
    if v is None:
        return True
    if not isinstance(v, str) or (not empty and not v) or (limit is not None and len(v) > limit):
        return False
    v.encode("utf-8")  # raises for a lone surrogate
    return "\x00" not in v  # which PostgreSQL's text cannot hold


def _float_ok(v: Any) -> bool:
    return v is None or (type(v) is float and math.isfinite(v))


def _int_ok(v: Any, bound: int = events.MAX_INT) -> bool:
    return v is None or (type(v) is int and -bound <= v <= bound)


def check(parsed: Any) -> None:
    """What the control plane may rely on in any parsed event."""
    assert type(parsed.seq) is int and 0 <= parsed.seq <= events.MAX_SEQ
    assert parsed.ts is None or (_float_ok(parsed.ts) and parsed.ts != 0)
    if isinstance(parsed, events.Log):
        assert isinstance(parsed.message, str) and _text_ok(parsed.message)
        for tag in (parsed.stream, parsed.level):
            assert _text_ok(tag, events.MAX_TAG, empty=False)
        assert type(parsed.truncated) is bool
    elif isinstance(parsed, events.Progress):
        assert _float_ok(parsed.percent) and _float_ok(parsed.eta_s)
        assert _int_ok(parsed.step) and _int_ok(parsed.step_total)
        assert _text_ok(parsed.phase, events.MAX_TEXT) and _text_ok(parsed.message, events.MAX_TEXT)
        json.dumps(parsed.as_dict(), allow_nan=False)  # what the store keeps as progress_json
    elif isinstance(parsed, events.Started):
        assert _int_ok(parsed.pid) and _text_ok(parsed.job_name, events.MAX_TEXT)
    else:
        assert isinstance(parsed, events.Finished)
        for text in (parsed.status, parsed.signal, parsed.error, parsed.stop_reason):
            assert _text_ok(text, events.MAX_TEXT, empty=False)
        assert _int_ok(parsed.exit_code)
        assert parsed.result is None or type(parsed.result) is dict
        assert type(parsed.artifacts) is tuple and all(type(a) is dict for a in parsed.artifacts)
        assert _float_ok(parsed.started_at) and _float_ok(parsed.finished_at)
        outcome = parsed.as_outcome()
        assert set(outcome) == set(events.OUTCOME_FIELDS) and isinstance(outcome["artifacts"], list)


def test_the_parser_takes_anything() -> None:
    rng = random.Random(12)
    kinds = set()
    for obj in hostile_objects(rng, 4000):
        parsed = events.parse(obj)
        if parsed is not None:
            kinds.add(parsed.type)
            assert isinstance(obj, dict) and obj["type"] == parsed.type
            check(parsed)
        outcome = events.parse_outcome(obj)
        assert (outcome is None) == (not isinstance(obj, dict))
        if outcome is not None:
            check(outcome)
        assert type(events.seq_of(obj)) is int
    assert kinds == events.TYPES


# ---- the real runner --------------------------------------------------------------------------
TOOL = r"""
import os, sys
from pathlib import Path
from controlplane_runner import toolkit
assert toolkit.inputs() == {"n": 3}
print("hello")
print("WARN: careful", flush=True)
print("x" * 20000)
sys.stdout.flush()
sys.stdout.buffer.write(b"bad \xff\xfe bytes\n")
sys.stdout.buffer.flush()
print("error: on stderr", file=sys.stderr, flush=True)
toolkit.progress(step=1, step_total=2, phase="one", message="m")
toolkit.progress(50.0, eta_s=1.5)
os.write(int(os.environ["CONTROLPLANE_PROGRESS_FD"]), b'not json\n["x"]\n{"percent": [1]}\n{"phase": null}\n')
toolkit.artifact("out.txt", kind="text").write_text("hi")
Path(os.environ["CONTROLPLANE_ARTIFACTS_DIR"], ".hidden").write_text("skipped")
toolkit.result({"ok": True, "n": 3})
"""

TASK = "t-events-1"


def run_runner(tmp: Path, command: list[str], *, callback: str | None = None, workdir: bool = True,
               timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], LocalObjectStore]:
    store = LocalObjectStore(tmp / "store")
    store.put_bytes(inputs_key(AttemptRef(TASK, 1)), json.dumps({"n": 3}).encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(CONTROLPLANE_TASK_ID=TASK, CONTROLPLANE_ATTEMPT="1", CONTROLPLANE_STORE_URL=store.url,
               CONTROLPLANE_KILL_GRACE_S="2", CONTROLPLANE_HEARTBEAT_S="0.2", PYTHONPATH=str(ROOT))
    if callback:
        env.update(CONTROLPLANE_CALLBACK_URL=callback, CONTROLPLANE_BOOTSTRAP_TOKEN="bootstrap")
    env["TMPDIR"] = str(tmp / "tmp")  # where a runner without --workdir makes its scratch directory
    (tmp / "tmp").mkdir(exist_ok=True)
    where = ["--workdir", str(tmp / "work")] if workdir else []
    done = subprocess.run([sys.executable, "-m", "controlplane_runner", "--job-name", "cp-events", *where,
                           "--exit-file", str(tmp / "exit.json"), "--", *command],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return done, store


def spilled(store: LocalObjectStore) -> list[Any]:
    lines = []
    for key in sorted(store.list(events_prefix(AttemptRef(TASK, 1)))):
        lines += [json.loads(line) for line in store.get_bytes(key).splitlines()]
    return lines


def check_stream(raw: list[Any]) -> list[Any]:
    """Every event the runner wrote parses, carries only documented fields, and the seqs run from
    1 with no gap, ending with `finished`."""
    parsed = [events.parse(e) for e in raw]
    assert None not in parsed, [e for e, p in zip(raw, parsed, strict=True) if p is None]
    for e, p in zip(raw, parsed, strict=True):
        assert set(e) - COMMON <= DOCUMENTED[e["type"]], e
        assert type(e["seq"]) is int and type(e["ts"]) is float and p.ts == e["ts"]
        check(p)
    assert [p.seq for p in parsed] == list(range(1, len(parsed) + 1))
    assert [p.type for p in parsed].count(events.FINISHED) == 1 and parsed[-1].type == events.FINISHED
    return parsed


def test_the_runner_writes_only_events_the_parser_knows(tmp_path: Path) -> None:
    """No callback: every event goes to the object store as JSON lines."""
    done, store = run_runner(tmp_path, [sys.executable, "-c", TOOL])
    assert done.returncode == 0, done.stderr
    parsed = check_stream(spilled(store))
    assert {p.type for p in parsed} == events.TYPES
    logs = [p for p in parsed if isinstance(p, events.Log)]
    by_text = {p.message[:20]: p for p in logs}
    assert by_text["hello"].level == "info" and by_text["WARN: careful"].level == "warning"
    err = by_text["error: on stderr"]
    assert err == events.Log(seq=err.seq, ts=err.ts, message="error: on stderr", stream="stderr", level="error")
    long = by_text["x" * 20]
    assert long.truncated and long.message == "x" * events.MAX_MESSAGE
    assert by_text["bad \ufffd\ufffd bytes"].stream == "stdout"
    # the runner's own note, on an artifact it would not upload
    assert any(p.stream == "stderr" and p.level == "warning" and ".hidden" in p.message for p in logs)
    # Progress is coalesced (only a batch's latest report is sent); the last report held a null,
    # which the runner relays as a scalar and the parser reads as "not given".
    raw_progress = [e for e in spilled(store) if e["type"] == events.PROGRESS]
    assert raw_progress[-1] == {"type": "progress", "phase": None, "ts": raw_progress[-1]["ts"],
                                "seq": raw_progress[-1]["seq"]}
    progress = [p for p in parsed if isinstance(p, events.Progress)]
    assert progress[-1].as_dict() == {}
    assert all(p.as_dict() in ({"step": 1, "step_total": 2, "phase": "one", "message": "m", "percent": 50.0},
                               {"percent": 50.0, "eta_s": 1.5}, {}) for p in progress)
    started = parsed[0]  # made before the tool's output is read
    assert isinstance(started, events.Started) and started.job_name == "cp-events" and started.pid

    finished = parsed[-1]
    assert finished.status == events.SUCCEEDED and finished.exit_code == 0 and finished.error is None
    assert finished.result == {"ok": True, "n": 3}
    [art] = finished.artifacts
    assert set(art) == ARTIFACT_FIELDS and (art["name"], art["kind"], art["size_bytes"]) == ("out.txt", "text", 2)
    result_json = json.loads(store.get_bytes(result_key(AttemptRef(TASK, 1))))
    assert set(result_json) == set(events.OUTCOME_FIELDS)
    assert events.parse_outcome(result_json) == dataclasses.replace(finished, seq=0, ts=None)
    assert json.loads((tmp_path / "exit.json").read_text()) == result_json


def test_a_runner_without_a_workdir_leaves_no_scratch_behind(tmp_path: Path) -> None:
    """A cloud job's runner makes its own scratch directory (no --workdir); the tool runs in it,
    its artifacts are uploaded from it, and it is gone once the runner exits."""
    done, store = run_runner(tmp_path, [sys.executable, "-c", TOOL], workdir=False)
    assert done.returncode == 0, done.stderr
    finished = check_stream(spilled(store))[-1]
    assert finished.status == events.SUCCEEDED and [a["name"] for a in finished.artifacts] == ["out.txt"]
    assert store.get_bytes(artifact_key(AttemptRef(TASK, 1), "out.txt")) == b"hi"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_tool_that_cannot_start(tmp_path: Path) -> None:
    done, store = run_runner(tmp_path, [str(tmp_path / "no-such-tool")])
    assert done.returncode == 127
    parsed = check_stream(spilled(store))
    assert [p.type for p in parsed] == [events.FINISHED]  # never started
    assert parsed[0].status == events.FAILED and parsed[0].exit_code == 127 and "cannot start tool" in parsed[0].error
    assert events.parse_outcome(json.loads(store.get_bytes(result_key(AttemptRef(TASK, 1))))).as_outcome() == \
        parsed[0].as_outcome()


class FakeCallback(ThreadingHTTPServer):
    """The runner API's two routes: claim hands out a secret; events are kept, acknowledged, and
    answered cancel: true once the tool has started."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.batches: list[list[Any]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/runner/v1"


class Handler(BaseHTTPRequestHandler):
    server: FakeCallback

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/claim"):
            answer: dict[str, Any] = {"secret": "s3cret"}
        else:
            assert self.headers["Authorization"] == "Bearer s3cret"
            with self.server.lock:
                self.server.batches.append(body["events"])
                seen = [e for b in self.server.batches for e in b]
            answer = {"ack_seq": max((e["seq"] for e in seen), default=0),
                      "cancel": any(e["type"] == events.STARTED for e in seen)}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_the_runner_reports_by_callback_and_stops_on_cancel(tmp_path: Path) -> None:
    server = FakeCallback()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        tool = "import time; print('working', flush=True); time.sleep(30)"
        done, store = run_runner(tmp_path, [sys.executable, "-c", tool], callback=server.url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert done.returncode == 143, done.stderr
    by_seq: dict[int, Any] = {}
    for e in [e for b in server.batches for e in b]:
        assert by_seq.setdefault(e["seq"], e) == e  # a repeated seq repeats the same event
    parsed = check_stream([by_seq[n] for n in sorted(by_seq)])
    assert not spilled(store)  # all of it came by callback
    finished = parsed[-1]
    assert (finished.status, finished.stop_reason, finished.signal, finished.exit_code) == \
        (events.CANCELLED, events.STOP_CANCEL, "SIGTERM", 143)
    assert events.parse_outcome(json.loads(store.get_bytes(result_key(AttemptRef(TASK, 1))))) == \
        dataclasses.replace(finished, seq=0, ts=None)


def test_a_burst_of_stop_signals_stops_the_runner(tmp_path: Path) -> None:
    """Cancels repeated quickly send the runner SIGTERM after SIGTERM; signals that arrive while
    it handles one (or while it waits) must not wedge it. It stops the tool and reports."""
    store = LocalObjectStore(tmp_path / "store")
    store.put_bytes(inputs_key(AttemptRef(TASK, 1)), b"{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(CONTROLPLANE_TASK_ID=TASK, CONTROLPLANE_ATTEMPT="1", CONTROLPLANE_STORE_URL=store.url,
               CONTROLPLANE_KILL_GRACE_S="2", PYTHONPATH=str(ROOT))
    tool = "import time; print('sleeping', flush=True); time.sleep(60)"
    for round_ in range(3):
        store.delete_prefix(claim_key(AttemptRef(TASK, 1)))  # each round is a new execution of the attempt, not an extra one
        exit_file = tmp_path / f"exit{round_}.json"
        runner = subprocess.Popen([sys.executable, "-m", "controlplane_runner", "--workdir", str(tmp_path / "work"),
                                   "--exit-file", str(exit_file), "--", sys.executable, "-c", tool],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert runner.stdout is not None and runner.stdout.readline().strip() == "sleeping"
            for _ in range(2000):
                runner.send_signal(signal.SIGTERM)
            runner.wait(timeout=30)
        finally:
            runner.kill()
            runner.wait()
        outcome = json.loads(exit_file.read_text())
        assert (outcome["status"], outcome["stop_reason"]) == (events.CANCELLED, events.STOP_SIGNAL), outcome


# ---- what the module may import ---------------------------------------------------------------
def test_events_imports_only_the_standard_library(tmp_path: Path) -> None:
    own = {f"controlplane_runner.{path.stem}" for path in EVENT_MODULES}
    for path in EVENT_MODULES:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0 and node.module, "a relative import ties the module to its package"
                imported.add(node.module if node.module in own else node.module.split(".")[0])
        assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"} | own, (path.name, imported)
    # ... and they load on an interpreter that sees nothing but the standard library
    package = tmp_path / "controlplane_runner"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for path in EVENT_MODULES:
        shutil.copy(path, package / path.name)
    probe = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from controlplane_runner import events; "
             "events.parse(events.log('x')); assert not [p for p in sys.path if 'site-packages' in p]")
    subprocess.run([sys.executable, "-I", "-S", "-c", probe], check=True, timeout=30)


def test_the_job_image_ships_it() -> None:
    for module in EVENT_MODULES:
        assert any((src.is_dir() and module.is_relative_to(src)) or src == module for src, _ in copies()), module
