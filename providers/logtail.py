"""Tailing a cloud's log *query* service (Cloud Logging, Log Analytics) page by page.

Both services are queried rather than streamed, both have a per-minute read quota far below what
a few agents tailing a few tasks would ask for, and both order entries by a timestamp that can
repeat. So the providers that read them share three habits, kept here:

* `within_quota`: a read takes a place in the per-project (per-workspace) limiter without
  waiting; over the quota the tail answers "try again in N s" with its cursor unchanged
  (`over_quota`), rather than hang an MCP call. (Cloud Run holds each HTTP call of its logging
  client in the limiter instead, `ratelimit.limit_session`, and answers the same page.)
* `SharedPages`: concurrent tails of one execution at one cursor share one read for a few
  seconds (one read per key at a time).
* `after_cursor`: the cursor is (timestamp text, tiebreak id); a page is asked for from the
  cursor's instant inclusive, and entries at or before the cursor are skipped, so a second entry
  at the same instant is never lost and none is returned twice. Timestamps are compared as the
  service's own text (fixed width, UTC), never through a float.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable

from controlplane_providers.base import LogLine, LogPage
from controlplane_providers.ratelimit import SlidingWindowLimiter

SHARED_PAGE_S = 3.0  # concurrent tails of one execution share a page this long


def within_quota(limiter: SlidingWindowLimiter, cursor: str | None, quota: str, read: Callable[[], LogPage]) -> LogPage:
    """`read()` if the limiter has a place now, else an empty page that says when to try again.
    `quota` names the limit for the caller ("Cloud Logging allows 60 reads a minute per project")."""
    place = limiter.try_acquire()
    if place is None:
        return over_quota(cursor, quota, limiter.wait_s())
    try:
        return read()
    finally:
        limiter.release(place)


def over_quota(cursor: str | None, quota: str, wait_s: float) -> LogPage:
    """The empty page a tail gets when the read quota has no place for it: same cursor, and when
    to try again."""
    return LogPage([], cursor, reason=(
        f"{quota}; try again in {wait_s:.0f} s (the runner's own log, source='task', has every line)"))


def split_cursor(cursor: str | None) -> tuple[str, str]:
    """(timestamp text, tiebreak) of a cursor; ("", "") for the start."""
    ts, _, tiebreak = (cursor or "").partition("|")
    return ts, tiebreak


def after_cursor(entries: Iterable[tuple[tuple[str, str], LogLine]], cursor: str | None, limit: int) -> LogPage:
    """The first `limit` entries after `cursor`, from (key, line) pairs in key order, where key is
    (timestamp text, tiebreak); the page's cursor is the last key returned (or the old cursor)."""
    after = split_cursor(cursor)
    lines: list[LogLine] = []
    last = after
    for key, line in entries:
        if after[0] and key <= after:
            continue  # at or before the cursor: returned by an earlier page
        if len(lines) >= limit:
            break
        lines.append(line)
        last = key
    return LogPage(lines, f"{last[0]}|{last[1]}" if last[0] else cursor)


class SharedPages:
    """Log pages shared by concurrent tails for a few seconds; one read per key at a time."""

    def __init__(self, ttl_s: float = SHARED_PAGE_S):
        self.ttl_s = ttl_s
        self._pages: dict[Hashable, tuple[float, LogPage]] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, read: Callable[[], LogPage]) -> LogPage:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            now = time.monotonic()
            hit = self._pages.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
            page = read()
            with self._lock:
                for k in [k for k, (exp, _) in self._pages.items() if exp <= now]:
                    self._pages.pop(k, None)
                    self._locks.pop(k, None)
                if page.reason is None:  # an answer worth sharing (not a throttled one)
                    self._pages[key] = (now + self.ttl_s, page)
            return page
