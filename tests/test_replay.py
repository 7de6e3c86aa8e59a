"""The 2025-11-25 replay buffer: a client that resumes with Last-Event-ID gets exactly the events
of its stream after that id, and the buffer stays within its bounds (events in all, per stream,
and age)."""

from __future__ import annotations

import pytest
from mcp_types import JSONRPCNotification

from controlplane.http import replay
from controlplane.http.replay import ReplayBuffer

pytestmark = pytest.mark.anyio


def note(i: int) -> JSONRPCNotification:
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params={"progress": i})


async def replayed(buf: ReplayBuffer, last: str) -> tuple[str | None, list[int]]:
    got: list[int] = []

    async def send(ev: object) -> None:
        got.append(ev.message.params["progress"])  # type: ignore[attr-defined]

    stream = await buf.replay_events_after(last, send)
    return stream, got


async def test_resuming_replays_the_rest_of_that_stream_only() -> None:
    buf = ReplayBuffer(max_events=100, events_per_stream=100, ttl_s=60)
    prime = await buf.store_event("a", None)  # a priming event carries no message
    ids = [await buf.store_event("a", note(i)) for i in range(5)]
    await buf.store_event("b", note(99))
    assert await replayed(buf, ids[1]) == ("a", [2, 3, 4])
    assert await replayed(buf, prime) == ("a", [0, 1, 2, 3, 4])
    assert await replayed(buf, ids[-1]) == ("a", [])
    assert await replayed(buf, "nope") == (None, [])
    assert len(set(ids)) == 5 and ReplayBuffer(max_events=1, events_per_stream=1, ttl_s=1)._prefix != buf._prefix


async def test_the_buffer_keeps_within_its_bounds() -> None:
    buf = ReplayBuffer(max_events=10, events_per_stream=4, ttl_s=60)
    a = [await buf.store_event("a", note(i)) for i in range(6)]
    assert await replayed(buf, a[1]) == (None, [])  # beyond the stream's last four
    assert await replayed(buf, a[2]) == ("a", [3, 4, 5])
    for s in range(5):
        await buf.store_event(f"s{s}", note(s))
    for s in range(5):
        await buf.store_event(f"t{s}", note(s))
    assert len(buf) <= 10  # the oldest went first
    assert await replayed(buf, a[5]) == (None, [])
    assert len(buf._streams) <= 10


async def test_events_older_than_the_ttl_are_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(replay.time, "monotonic", lambda: now[0])
    buf = ReplayBuffer(max_events=100, events_per_stream=100, ttl_s=30)
    old = await buf.store_event("a", note(1))
    now[0] += 31
    fresh = await buf.store_event("a", note(2))
    assert await replayed(buf, old) == (None, [])
    assert len(buf) == 1 and await replayed(buf, fresh) == ("a", [])
