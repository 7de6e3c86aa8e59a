"""Ingestion of what runners report: event batches from the HTTP callback, event chunks and
`result.json` from the object store, and heartbeats.

Both paths end in `Store.ingest`, which is idempotent by sequence number, so an event that
arrives by callback and is also found in the store is applied once.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from controlplane.catalog import Catalog, RetryPolicy
from controlplane.objectstore.base import (
    UnsafeKey,
    artifact_key,
    events_prefix,
    result_key,
    safe_artifact_name,
)
from controlplane.objectstore.registry import StoreRegistry
from controlplane.outcomes import Decision, decide
from controlplane.settings import Settings
from controlplane.store.store import IngestResult, Store


class Ingestor:
    def __init__(self, store: Store, catalog: Catalog, stores: StoreRegistry, settings: Settings):
        self.store = store
        self.catalog = catalog
        self.stores = stores
        self.settings = settings
        self._beats: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def policy(self, tool_name: str) -> RetryPolicy:
        tool = self.catalog.tool(tool_name)
        return tool.retry if tool else RetryPolicy()

    def _decide(self, task: dict[str, Any], outcome: dict[str, Any]) -> Decision:
        return decide(task, outcome, self.policy(task["tool_name"]))

    def artifact_checker(self, task_id: str, attempt: int):
        def check(reported: list[dict[str, Any]]) -> list[dict[str, Any]]:
            good = []
            for a in reported:
                try:
                    name = safe_artifact_name(a.get("name"))
                    if a.get("key") != artifact_key(task_id, attempt, name):
                        continue  # a key outside this attempt's prefix is never registered
                    int(a["size_bytes"])
                    if not isinstance(a.get("sha256"), str) or len(a["sha256"]) != 64:
                        continue
                except (UnsafeKey, KeyError, TypeError, ValueError):
                    continue
                good.append(a)
            return good
        return check

    def apply(self, task_id: str, attempt: int, events: list[dict[str, Any]]) -> IngestResult:
        """Apply a batch; if earlier events are missing, fetch them from the object store first.
        Raises StaleAttempt for an attempt that is no longer current."""
        kwargs = dict(artifacts_ok=self.artifact_checker(task_id, attempt), max_line=self.settings.max_log_line_bytes,
                      log_cap=self.settings.max_log_lines_per_task)
        r = self.store.ingest(task_id, attempt, events, self._decide, **kwargs)
        if r.gap_from is not None:
            missing = self.read_spilled(r.store_url, task_id, attempt, r.gap_from)
            r = self.store.ingest(task_id, attempt, missing + events, self._decide, **kwargs)
        return r

    def read_spilled(self, store_url: str, task_id: str, attempt: int, from_seq: int) -> list[dict[str, Any]]:
        """Events a runner wrote to the object store (no callback, or callback unreachable)."""
        objects = self.stores.get(store_url)
        out: list[dict[str, Any]] = []
        for key in objects.list(events_prefix(task_id, attempt)):
            for line in objects.get_bytes(key).splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and int(e.get("seq", 0)) >= from_seq:
                    out.append(e)
        return out

    def read_outcome(self, store_url: str, task_id: str, attempt: int) -> dict[str, Any] | None:
        try:
            data = json.loads(self.stores.get(store_url).get_bytes(result_key(task_id, attempt)))
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    # ---- heartbeats: kept in memory, written in batches ---------------------------------------
    def beat(self, task_id: str, attempt: int, ts: float) -> None:
        with self._lock:
            self._beats[(task_id, attempt)] = ts

    def flush_beats(self) -> None:
        with self._lock:
            beats, self._beats = self._beats, {}
        self.store.touch(beats)
