"""Client-side rate limits for cloud APIs, shared by every client of one account and region.

One limiter for every cloud: each provider takes the limiter named for its API, account or
project, and region (`key(...)`, `shared(...)`) and makes every HTTP request to that API hold a
place in it, retries included. How a request is held depends on the SDK, not on the limiter:
`BotocoreHook` hooks botocore's request events (botocore retries inside the SDK), `held`
wraps one call for SDKs whose own retries the provider switches off and does itself (Google's
API core), and `limit_session` puts an adapter under a `requests` session, so that every HTTP request the
session sends takes a place, whatever the SDK above it does (a pager that reads ahead, a
retry). `try_acquire` serves quotas a caller would rather report than wait for (Cloud
Logging's 60 reads a minute: a log tail answers "try again" instead of hanging).

The limit is on what the service sees: in no one-second window may more than `rate` requests
reach it. Counting start times is not enough for that, because requests spend time in flight
(connection setup, queueing) and arrive bunched. So a request holds its place from the moment it
starts until one window after it ends: a new request starts only while fewer than `rate`
requests are in flight or ended within the last window. Any window at the service then holds at
most `rate` arrivals (the last of them to start saw all the others still holding a place).

Limiters are registered by name (e.g. "batch:us-east-1:<endpoint>") so that all clients of the
same API in one process share one. Each counts what passed it (`calls`; `waits` and `waited_s`
spent waiting for a place; `rate_limited`, answers 429; `errors`, requests that raised or answered
an error status, told at `release`): the operator's metrics read these counts at scrape time
(`controlplane.ops.metrics.LimiterCollector`), so every cloud request is counted in this one place.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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
        self.waits = 0  # requests that had to wait for a place (client-side throttling)
        self.waited_s = 0.0
        self.rate_limited = 0  # answers 429: the service throttled us
        self.errors = 0  # requests that raised, or answered a status >= 400

    def _take(self, now: float) -> int | None:
        """Under the lock: forget places whose window has passed, then take one if any is free."""
        for token, end in list(self._holders.items()):
            if end <= now - self.window_s:
                del self._holders[token]
        if len(self._holders) >= self.rate:
            return None
        token = next(self._ids)
        self._holders[token] = _IN_FLIGHT
        self.calls += 1
        return token

    def acquire(self) -> int:
        """Block until a request may start; returns a token to `release` when it has ended."""
        waited = False
        while True:
            with self._lock:
                now = time.monotonic()
                token = self._take(now)
                if token is not None:
                    self.waits += waited
                    return token
                ends = [e for e in self._holders.values() if e != _IN_FLIGHT]
                wait = (min(ends) + self.window_s - now + 1e-4) if ends else 0.01
            waited = True
            self.waited_s += wait
            time.sleep(max(wait, 1e-3))

    def try_acquire(self) -> int | None:
        """A token if a request may start now, else None (never waits)."""
        with self._lock:
            return self._take(time.monotonic())

    def wait_s(self) -> float:
        """Seconds until a place is likely to free up (0 if one is free now)."""
        with self._lock:
            now = time.monotonic()
            live = [e for e in self._holders.values() if e == _IN_FLIGHT or e > now - self.window_s]
            if len(live) < self.rate:
                return 0.0
            ends = [e for e in live if e != _IN_FLIGHT]
            return max(0.0, min(ends) + self.window_s - now) if ends else self.window_s

    def release(self, token: int, *, status: int | None = None, failed: bool = False) -> None:
        """The request has ended; `status` (its HTTP status, if known) or `failed` (it raised) count it."""
        with self._lock:
            if token in self._holders:
                self._holders[token] = time.monotonic()
            self.rate_limited += status == 429
            self.errors += failed or (status is not None and status >= 400)


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

    def _end(self, response: Any = None, caught_exception: object = None, **_: object) -> None:
        token = getattr(self._local, "token", None)
        if token is not None:
            self._local.token = None
            http = response[0] if isinstance(response, tuple) and response else None
            self.limiter.release(token, status=getattr(http, "status_code", None),
                                 failed=caught_exception is not None)


class OverQuota(Exception):
    """A request was not sent: its limiter had no place free (`limit_session` without waiting)."""

    def __init__(self, limiter: SlidingWindowLimiter):
        super().__init__(f"no place free in {limiter.rate} a {limiter.window_s:g} s")
        self.wait_s = limiter.wait_s()


@functools.cache
def _quota_adapter() -> type:
    """The QuotaAdapter class, made on first use: `requests` comes with the SDKs whose sessions it
    limits (google-auth), not with a bare install, which imports this module for its metrics."""
    from requests.adapters import HTTPAdapter

    class QuotaAdapter(HTTPAdapter):
        """A `requests` transport adapter: every request sent through it holds a place in `limiter`
        (or in the limiter a function names at each request: limiters are found by name, `shared`)
        from before it is sent until its answer has come. Without `wait`, a request that finds no
        place free is not sent and raises OverQuota (mount it on a session for "https://" and
        "http://": `limit_session`)."""

        def __init__(self, limiter: SlidingWindowLimiter | Callable[[], SlidingWindowLimiter], *, wait: bool = False):
            super().__init__()
            self.limiter, self.wait = limiter, wait

        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            limiter = self.limiter if isinstance(self.limiter, SlidingWindowLimiter) else self.limiter()
            token = limiter.acquire() if self.wait else limiter.try_acquire()
            if token is None:
                raise OverQuota(limiter)
            try:
                response = super().send(request, *args, **kwargs)
            except BaseException:
                limiter.release(token, failed=True)
                raise
            limiter.release(token, status=response.status_code)
            return response

    return QuotaAdapter


def limit_session(session: Any, limiter: SlidingWindowLimiter | Callable[[], SlidingWindowLimiter], *,
                  wait: bool = False) -> Any:
    """`session` (a requests.Session, e.g. google-auth's AuthorizedSession) with every request
    it sends held in `limiter` (a QuotaAdapter mounted for both schemes); returns the session."""
    adapter = _quota_adapter()(limiter, wait=wait)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session


class Request:
    """One request holding a place; set `status` to the HTTP status it was answered with."""

    status: int | None = None


@contextmanager
def held(limiter: SlidingWindowLimiter) -> Iterator[Request]:
    """Hold a place in `limiter` for one request: from before it starts until it has ended."""
    token = limiter.acquire()
    request = Request()
    try:
        yield request
    except BaseException as e:
        limiter.release(token, status=status_of(e), failed=True)
        raise
    limiter.release(token, status=request.status)


def status_of(e: BaseException) -> int | None:
    """The HTTP status an SDK's exception carries (google-api-core: `code`; azure-core and
    httpx: `status_code`, or the response's)."""
    for value in (getattr(e, "code", None), getattr(e, "status_code", None),
                  getattr(getattr(e, "response", None), "status_code", None)):
        if isinstance(value, int):
            return value
    return None


def key(api: str, *, account: str | None = None, region: str | None = None, endpoint: str | None = None) -> str:
    """The name of the limiter for one API of one account (or project) and region. The endpoint is
    part of it so that an emulator or a private endpoint never shares a budget with the cloud."""
    return ":".join([api, account or "-", region or "-", endpoint or "-"])


def limiters() -> list[tuple[str, SlidingWindowLimiter]]:
    """Every limiter of the process, by name."""
    with _registry_lock:
        return sorted(_registry.items())


def shared(name: str, rate: float, window_s: float = 1.0) -> SlidingWindowLimiter:
    """The process-wide limiter called `name` (created with `rate` per `window_s` on first use)."""
    with _registry_lock:
        limiter = _registry.get(name)
        if limiter is None:
            limiter = _registry[name] = SlidingWindowLimiter(rate, window_s)
        return limiter
