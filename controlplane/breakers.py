"""Circuit breakers per placement site (a provider in one of its regions): after `failures`
failures within `window_s` (capacity refusals and failed launches at the site, failed polls of
its provider) the site is open, skipped by the choice of placement for a cool-down; then
half-open, one attempt let through as a probe; its launch succeeding closes the breaker, failing
reopens it for twice the last cool-down (at most `max_cooldown_s`).

Kept in the leader's memory, like provider health (`ops/health.py`): docs/design/placement.md
says why, and why a breaker is per site rather than per tool's placement.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

State = Literal["closed", "half_open", "open"]
STATES: tuple[State, ...] = ("closed", "half_open", "open")


def site(provider: str, region: str | None) -> str:
    """A breaker's key: the provider, and the region its jobs run in when it names one."""
    return f"{provider}/{region}" if region else provider


@dataclass
class _Breaker:
    failures: deque[float] = field(default_factory=deque)  # when, within the window (closed)
    state: State = "closed"
    until: float = 0.0  # (clock) the end of the cool-down, while open
    cooldown: float = 0.0  # the last cool-down (0: closed since it last opened)
    probe_at: float | None = None  # (clock) when the probe was let through (half-open)


class Breakers:
    """Every site's breaker, created when the site is first seen. Thread-safe."""

    def __init__(self, failures: int = 3, window_s: float = 300.0, cooldown_s: float = 60.0,
                 max_cooldown_s: float = 1800.0, clock: Callable[[], float] = time.monotonic):
        self.failures, self.window_s = max(1, failures), window_s
        self.cooldown_s, self.max_cooldown_s = cooldown_s, max(cooldown_s, max_cooldown_s)
        self.clock = clock
        self._lock = threading.Lock()
        self._of: dict[str, _Breaker] = {}
        self._sites: dict[str, set[str]] = {}  # provider -> its sites seen

    def _get(self, key: str) -> _Breaker:
        b = self._of.get(key)
        if b is None:
            b = self._of[key] = _Breaker()
            self._sites.setdefault(key.split("/", 1)[0], set()).add(key)
        return b

    def _settle(self, b: _Breaker, now: float) -> None:
        if b.state == "open" and now >= b.until:
            b.state, b.probe_at = "half_open", None
        elif b.state == "half_open" and b.probe_at is not None and now - b.probe_at >= max(self.cooldown_s, b.cooldown):
            b.probe_at = None  # a probe that never reached its provider (cancelled first): another may go

    def admits(self, key: str) -> bool:
        """Whether an attempt may be placed at `key` now: closed, or half-open with no probe out."""
        with self._lock:
            b = self._get(key)
            self._settle(b, self.clock())
            return b.state == "closed" or b.state == "half_open" and b.probe_at is None

    def chose(self, key: str) -> None:
        """An attempt was placed at `key`: when half-open, it is the probe (no other goes until it ends)."""
        with self._lock:
            b = self._get(key)
            if b.state == "half_open" and b.probe_at is None:
                b.probe_at = self.clock()

    def succeeded(self, key: str) -> None:
        """A launch at `key` succeeded: closed, its failures forgotten."""
        with self._lock:
            b = self._get(key)
            b.state, b.probe_at, b.cooldown = "closed", None, 0.0
            b.failures.clear()

    def failed(self, key: str) -> None:
        """A failure at `key`: counted while closed (opens at the threshold); reopens, for longer,
        when half-open; nothing more while open."""
        with self._lock:
            self._fail(self._get(key), self.clock())

    def provider_failed(self, provider: str) -> None:
        """A failure of the provider's API (a poll): a failure at each of its sites seen."""
        with self._lock:
            now = self.clock()
            for key in self._sites.get(provider, ()):
                self._fail(self._of[key], now)

    def _fail(self, b: _Breaker, now: float) -> None:
        self._settle(b, now)
        if b.state == "open":
            return
        if b.state == "half_open":
            self._open(b, now, min(self.max_cooldown_s, 2 * max(b.cooldown, self.cooldown_s)))
            return
        b.failures.append(now)
        while b.failures and b.failures[0] <= now - self.window_s:
            b.failures.popleft()
        if len(b.failures) >= self.failures:
            self._open(b, now, self.cooldown_s)

    @staticmethod
    def _open(b: _Breaker, now: float, cooldown: float) -> None:
        b.state, b.until, b.cooldown, b.probe_at = "open", now + cooldown, cooldown, None
        b.failures.clear()

    def states(self) -> dict[str, State]:
        """Each site's state now, by key."""
        with self._lock:
            now = self.clock()
            for b in self._of.values():
                self._settle(b, now)
            return {key: b.state for key, b in sorted(self._of.items())}
