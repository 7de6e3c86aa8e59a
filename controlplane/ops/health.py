"""Provider health as the reconciler sees it: when each provider was last polled, whether the
poll answered, and its failures (count, when, what kind).

Kept in the memory of the process that reconciles (the leader), not in the database: it changes
every cycle and is worth nothing after a restart (the next cycle says it again), and writing it
would add a write per provider per cycle to the one database every replica shares. A replica
that does not lead says so, and names the leader, instead of showing stale figures. Throttling
is the limiters' (`providers/ratelimit.py`), read beside this by the dashboard and /metrics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Seen:
    """What one provider's polls looked like."""

    polls: int = 0
    poll_errors: int = 0
    last_poll_at: float | None = None  # epoch seconds of the last poll (answered or not)
    last_ok_at: float | None = None
    last_error_at: float | None = None
    last_error: str | None = None  # the exception's type name only: its text may carry internals
    jobs: int = 0  # jobs in the last poll


class ProviderHealth:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, Seen] = {}
        # Told of each failed poll, by provider name: the placements' breakers (`controlplane.breakers`).
        self.on_error: Callable[[str], None] = lambda _provider: None

    def polled(self, provider: str, jobs: int, error: BaseException | None = None) -> None:
        now = time.time()
        with self._lock:
            s = self._seen.get(provider, Seen())
            s = replace(s, polls=s.polls + 1, last_poll_at=now, jobs=jobs)
            if error is None:
                s = replace(s, last_ok_at=now)
            else:
                s = replace(s, poll_errors=s.poll_errors + 1, last_error_at=now, last_error=type(error).__name__)
            self._seen[provider] = s
        if error is not None:
            self.on_error(provider)

    def snapshot(self) -> dict[str, Seen]:
        with self._lock:
            return dict(self._seen)
