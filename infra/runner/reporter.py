"""Delivery of a job's events (logs, progress, artifacts, its outcome) to the control plane.

The runner's callback secret is not in its environment: the job's spec carries a one-time
bootstrap token, which the reporter trades for the secret before its first delivery

    POST {callback}/tasks/{task_id}/attempts/{attempt}/claim   Authorization: Bearer <token>
    {"nonce": <random, this process's own>}   ->   {"secret": ...}

(a retry with the same nonce is answered again; any other claimant gets 403 ALREADY_CLAIMED). The
runner claims before anything else (`claim`) and runs the tool only with the claim.

Events (their format is written down in `controlplane_runner.events`) get a sequence number when they
leave the pending queue (progress is coalesced first: only the latest report in a batch is
kept). Batches are POSTed in order to

    {callback}/tasks/{task_id}/attempts/{attempt}/events    Authorization: Bearer <secret>

and stay buffered until acknowledged. While the control plane is unreachable the runner keeps
retrying with backoff; when the buffer grows past its cap, when no callback URL is configured,
or when the job ends unreachable, the unacknowledged events are written to the object store as
one chunk `events/<first seq>.jsonl`, which the control plane ingests from there. Ingestion is
idempotent by sequence number, so a batch that arrives twice is applied once.

The callback's answer can tell the runner to stop: `cancel: true` (the task was cancelled) or
HTTP 409 (this attempt is no longer the task's current one).
"""

from __future__ import annotations

import http.client
import json
import queue
import secrets
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import ObjectExists, ObjectStore, events_key
from controlplane.objectstore.claim import nonce_digest
from controlplane_runner import events

MAX_BATCH = 2000  # events per POST
OURS, TAKEN, OVER, REFUSED, UNREACHABLE = "ours", "taken", "over", "refused", "unreachable"  # `Reporter.claim`
MAX_UNACKED = 50_000  # events held in memory before spilling to the object store


class Reporter:
    def __init__(
        self,
        *,
        ref: AttemptRef,
        store: ObjectStore | None,
        callback_url: str | None,
        bootstrap: str | None = None,
        secret: str | None = None,
        endpoint_file: str | None = None,
        heartbeat_s: float = 10.0,
        flush_interval_s: float = 0.05,
        on_stop: Any = None,
    ):
        self.ref = ref
        self.store = store
        self.callback_url = callback_url
        self.bootstrap = bootstrap
        self.secret = secret
        self._nonce = secrets.token_hex(32)
        self.endpoint_file = endpoint_file
        self.heartbeat_s = heartbeat_s
        self.flush_interval_s = flush_interval_s
        self.on_stop = on_stop or (lambda reason: None)

        self._pending: queue.Queue[dict[str, Any]] = queue.Queue()
        self._unacked: list[dict[str, Any]] = []
        self._next_seq = 1
        self._closing = threading.Event()
        self._drained = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._backoff = 0.0
        self._next_try = 0.0
        self._last_contact = 0.0
        self.stop_reason: str | None = None
        self.delivered_by_callback = 0
        self.spilled = 0
        self._thread = threading.Thread(target=self._run, name="reporter", daemon=True)

    # ---- producer side ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def emit(self, event: dict[str, Any]) -> None:
        """Queue an event made by one of the builders of `controlplane_runner.events`."""
        self._pending.put(event)

    def close(self, timeout: float = 30.0) -> None:
        """Deliver everything (callback, else object store) and stop the thread."""
        self._closing.set()
        self._thread.join(timeout)
        if self._thread.is_alive():  # the callback kept timing out: make sure nothing is lost
            self._spill()

    # ---- delivery thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            closing = self._closing.is_set()
            self._collect(timeout=0 if closing else self.flush_interval_s)
            if closing and self._pending.empty():
                # Last round: one more try through the callback, then the object store.
                if self._unacked and self.callback_url:
                    self._deliver()
                if self._unacked:
                    self._spill()
                return
            now = time.monotonic()
            if not self.callback_url:
                # Store-only mode: write chunks every few seconds rather than every batch.
                if self._unacked and now - self._last_contact >= min(self.heartbeat_s, 2.0):
                    self._spill()
                    self._last_contact = now
            elif (self._unacked or now - self._last_contact >= self.heartbeat_s) and now >= self._next_try:
                self._deliver()
            if len(self._unacked) > MAX_UNACKED:
                self._spill()
            if self._backoff:
                time.sleep(min(self.flush_interval_s, max(0.0, self._next_try - time.monotonic())))

    def _collect(self, timeout: float) -> None:
        batch: list[dict[str, Any]] = []
        try:
            batch.append(self._pending.get(timeout=timeout) if timeout else self._pending.get_nowait())
            while len(batch) < MAX_BATCH * 4:
                batch.append(self._pending.get_nowait())
        except queue.Empty:
            pass
        if not batch:
            return
        # Coalesce progress: only the latest report of this batch survives.
        last_progress = max((i for i, e in enumerate(batch) if e.get("type") == events.PROGRESS), default=-1)
        for i, e in enumerate(batch):
            if e.get("type") == events.PROGRESS and i != last_progress:
                continue
            self._unacked.append(events.number(e, self._next_seq))
            self._next_seq += 1

    def claim(self, wait_s: float) -> str:
        """Claim the attempt before the tool starts (called once, before `start`): `OURS`,
        `TAKEN` (another execution holds it), `OVER` (the attempt has ended), `REFUSED` (the token
        or the request was refused), or `UNREACHABLE` (no answer within `wait_s`)."""
        deadline = time.monotonic() + wait_s
        delay = 0.25
        while True:
            status, body = self._post({"nonce": self._nonce}, "claim", self.bootstrap)
            if status == 200 and isinstance(body.get("secret"), str):
                self.secret = body["secret"]
                return OURS
            if status == 403 and body.get("code") == "ALREADY_CLAIMED":
                return TAKEN
            if status == 409:
                return OVER
            if status is not None and 400 <= status < 500 and status != 429:
                return REFUSED
            if status is None and self.endpoint_file:  # unreachable: the server may have moved
                self._rediscover()
            if time.monotonic() + delay > deadline:
                return UNREACHABLE
            time.sleep(delay)
            delay = min(5.0, delay * 2)

    @property
    def nonce_sha256(self) -> str:
        return nonce_digest(self._nonce)

    def _claim(self) -> bool:
        """Trade the bootstrap token for the attempt's secret (a runner that claimed through the
        object store, once the control plane answers again). False: not now (or never)."""
        status, body = self._post({"nonce": self._nonce}, "claim", self.bootstrap)
        if status == 200 and isinstance(body.get("secret"), str):
            self.secret = body["secret"]
            return True
        if status == 409:  # the attempt is over: stop, as for a 409 on events
            self._stale()
        elif status in (400, 401, 403):
            print(f"runner: the control plane refused this runner's claim ({status}); "
                  "delivering events through the object store only", file=sys.stderr)
            self.callback_url = None
            self.endpoint_file = None
        else:
            self._back_off(status)
        return False

    def _deliver(self) -> None:
        if self.secret is None and not self._claim():
            return
        batch = self._unacked[:MAX_BATCH]
        status, body = self._post({"events": batch})
        if status == 200:
            ack = int(body.get("ack_seq", 0))
            self._unacked = [e for e in self._unacked if e["seq"] > ack]
            self.delivered_by_callback += len(batch)
            self._backoff = 0.0
            self._next_try = 0.0
            self._last_contact = time.monotonic()
            if body.get("cancel"):
                self._stop(events.STOP_CANCEL)
            return
        if status == 409:
            self._stale()
            return
        # Unreachable, 5xx or 401 (a secret the server no longer accepts): back off and retry.
        self._back_off(status)

    def _stale(self) -> None:
        """This attempt is no longer the task's current one: drop its events and stop the tool."""
        self._unacked.clear()
        self._stop(events.STOP_STALE)
        self._last_contact = time.monotonic()

    def _back_off(self, status: int | None) -> None:
        self._backoff = min(30.0, max(0.5, self._backoff * 2))
        self._next_try = time.monotonic() + self._backoff
        if status is None and self.endpoint_file:  # unreachable: the server may have moved
            self._rediscover()

    def _stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.on_stop(reason)

    def _spill(self) -> None:
        if not self._unacked:
            return
        if self.store is None:
            print("runner: cannot deliver events: no callback and no object store", file=sys.stderr)
            return
        chunk = self._unacked
        data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in chunk).encode()
        try:
            self.store.put_bytes(events_key(self.ref, chunk[0]["seq"]), data,
                                 content_type="application/x-ndjson")
        except ObjectExists:
            pass  # the same events were spilled before (idempotent by seq)
        except OSError as e:  # e.g. no grant for a spill key: keep the events for the next try
            print(f"runner: could not spill events to the object store: {e}", file=sys.stderr)
            return
        self.spilled += len(chunk)
        self._unacked = []

    # ---- grants (a job without storage credentials) -------------------------------------------
    def grants(self, names: list[str], *, ahead: bool = False) -> dict[str, dict[str, Any]] | None:
        """Signed requests for `names` of this attempt (`controlplane.objectstore.grants`), or None
        when the control plane cannot be asked (no callback, unreachable, refused). Called from
        the runner's threads, so it uses a connection of its own, not the delivery thread's."""
        if not self.callback_url:
            return None
        if self.secret is None:  # claimed through the object store: the same nonce is answered now
            status, body = self._post({"nonce": self._nonce}, "claim", self.bootstrap, shared=False)
            if status != 200 or not isinstance(body.get("secret"), str):
                return None
            self.secret = body["secret"]
        status, body = self._post({"names": names, "ahead": ahead}, "grants", shared=False)
        if status == 200 and isinstance(body.get("grants"), dict):
            grants: dict[str, dict[str, Any]] = body["grants"]
            return grants
        if status is not None:
            print(f"runner: the control plane refused grants for {names[:3]} ({status}: {body.get('code')})",
                  file=sys.stderr)
        return None

    # ---- HTTP ---------------------------------------------------------------------------------
    def _post(self, payload: dict[str, Any], route: str = "events", credential: str | None = None, *,
              shared: bool = True) -> tuple[int | None, dict[str, Any]]:
        """POST to the runner API on the delivery thread's keep-alive connection (`shared`), or on
        a connection of its own for a call from another thread."""
        url = urlsplit(self.callback_url or "")
        path = f"{url.path.rstrip('/')}/{self.ref.path}/{route}"
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {credential or self.secret}"}
        conn = self._conn if shared else None
        for _ in range(2):  # one retry on a dropped keep-alive connection
            try:
                if conn is None:
                    cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
                    conn = cls(url.hostname or "127.0.0.1", url.port, timeout=15)
                    if shared:
                        self._conn = conn
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                try:
                    data = json.loads(raw) if raw else {}
                except ValueError:
                    data = {}
                if not shared:
                    conn.close()
                return resp.status, data if isinstance(data, dict) else {}
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
                if shared:
                    self._conn = None
        return None, {}

    def _rediscover(self) -> None:
        try:
            with open(self.endpoint_file or "") as f:
                url = json.load(f).get("callback_url")
        except (OSError, ValueError):
            return
        if url and url != self.callback_url:
            self.callback_url = url
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._next_try = 0.0
