"""Client-side rate limits for cloud APIs, shared by every client of one account and region.

The limit is on what the service sees: in no one-second window may more than `rate` requests
reach it. Counting start times is not enough for that, because requests spend time in flight
(connection setup, queueing) and arrive bunched. So a request holds its place from the moment it
starts until one window after it ends: a new request starts only while fewer than `rate`
requests are in flight or ended within the last window. Any window at the service then holds at
most `rate` arrivals (the last of them to start saw all the others still holding a place).

Limiters are registered by name (e.g. "batch:us-east-1:<endpoint>") so that all clients of the
same API in one process share one.
"""

from __future__ import annotations

import itertools
import threading
import time

_registry: dict[str, SlidingWindowLimiter] = {}
_registry_lock = threading.Lock()
_IN_FLIGHT = float("inf")


class SlidingWindowLimiter:
    def __init__(self, rate: float, window_s: float = 1.0):
        self.rate = max(1, int(rate))
        self.window_s = window_s
        self._holders: dict[int, float] = {}  # token -> end time (inf while in flight)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.calls = 0
        self.waited_s = 0.0

    def acquire(self) -> int:
        """Block until a request may start; returns a token to `release` when it has ended."""
        while True:
            with self._lock:
                now = time.monotonic()
                for token, end in list(self._holders.items()):
                    if end <= now - self.window_s:
                        del self._holders[token]
                if len(self._holders) < self.rate:
                    token = next(self._ids)
                    self._holders[token] = _IN_FLIGHT
                    self.calls += 1
                    return token
                ends = [e for e in self._holders.values() if e != _IN_FLIGHT]
                wait = (min(ends) + self.window_s - now + 1e-4) if ends else 0.01
            self.waited_s += wait
            time.sleep(max(wait, 1e-3))

    def release(self, token: int) -> None:
        with self._lock:
            if token in self._holders:
                self._holders[token] = time.monotonic()


class BotocoreHook:
    """Applies a limiter to every HTTP request of a botocore client, retries included: a
    request starts at `before-send` and ends at `needs-retry`, which follows every attempt
    (requests are sent synchronously, so a thread-local pairs the two)."""

    def __init__(self, limiter: SlidingWindowLimiter):
        self.limiter = limiter
        self._local = threading.local()

    def install(self, client: object, service: str) -> None:
        events = client.meta.events  # type: ignore[attr-defined]
        events.register(f"before-send.{service}", self._start)
        events.register(f"needs-retry.{service}", self._end)

    def _start(self, **_: object) -> None:
        self._end()
        self._local.token = self.limiter.acquire()

    def _end(self, **_: object) -> None:
        token = getattr(self._local, "token", None)
        if token is not None:
            self._local.token = None
            self.limiter.release(token)


def shared(name: str, rate: float) -> SlidingWindowLimiter:
    """The process-wide limiter called `name` (created with `rate` on first use)."""
    with _registry_lock:
        limiter = _registry.get(name)
        if limiter is None:
            limiter = _registry[name] = SlidingWindowLimiter(rate)
        return limiter
