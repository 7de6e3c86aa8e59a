"""Replay for 2025-11-25 streams: the events a client that reconnects with Last-Event-ID missed.

The SDK hands every SSE event of the 2025-11-25 era to an event store before sending it, and
asks it for the events after an id when a client resumes. This one keeps them in memory, bounded
three ways: `max_events` in all (the oldest go first), `events_per_stream` per stream, and
`ttl_s` from when each was stored. fastmcp wraps it per session (`SessionScopedEventStore`), so
a client can only resume its own streams.

Why not fastmcp's `EventStore` over py-key-value's `MemoryStore`: for each event it builds two
pydantic models, dumps the message to JSON, goes through beartype-checked storage calls and
rewrites the stream's whole list of event ids (up to 1,000) — about an eighth of a 2025-11-25
call's server time under 16 clients (`bench/concurrency.py`), for a buffer that only matters
to a client whose connection broke. Here an event is one dict entry holding the message the SDK
already built (it is not changed after it is sent) and a deque append.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage


@dataclass(frozen=True, slots=True)
class _Event:
    stream_id: StreamId
    message: JSONRPCMessage | None
    stored_at: float


class ReplayBuffer(EventStore):
    def __init__(self, *, max_events: int, events_per_stream: int, ttl_s: float):
        self.max_events = max_events
        self.events_per_stream = events_per_stream
        self.ttl_s = ttl_s
        self._events: OrderedDict[EventId, _Event] = OrderedDict()  # oldest first
        self._streams: dict[StreamId, deque[EventId]] = {}
        # Ids never repeat within a process, nor across restarts (a resumed id from an earlier
        # process finds nothing rather than someone else's event).
        self._prefix = secrets.token_hex(4)
        self._counter = itertools.count(1)

    def __len__(self) -> int:
        return len(self._events)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        now = time.monotonic()
        self._evict(now)
        event_id = f"{self._prefix}-{next(self._counter)}"
        self._events[event_id] = _Event(stream_id, message, now)
        ids = self._streams.get(stream_id)
        if ids is None:
            ids = self._streams[stream_id] = deque()
        ids.append(event_id)
        if len(ids) > self.events_per_stream:
            self._drop(ids.popleft())
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        self._evict(time.monotonic())
        event = self._events.get(last_event_id)
        if event is None:
            return None
        ids = self._streams.get(event.stream_id, ())
        after = False
        for event_id in list(ids):
            if after:
                e = self._events.get(event_id)
                if e is not None and e.message is not None:
                    await send_callback(EventMessage(e.message, event_id))
            elif event_id == last_event_id:
                after = True
        return event.stream_id

    def _evict(self, now: float) -> None:
        """Drop events past their ttl and beyond `max_events`, oldest first."""
        events = self._events
        while events:
            event_id, oldest = next(iter(events.items()))
            if len(events) < self.max_events and now - oldest.stored_at < self.ttl_s:
                break
            events.popitem(last=False)
            ids = self._streams.get(oldest.stream_id)
            if ids is not None:
                if ids and ids[0] == event_id:
                    ids.popleft()
                else:
                    try:
                        ids.remove(event_id)
                    except ValueError:
                        pass
                if not ids:
                    del self._streams[oldest.stream_id]

    def _drop(self, event_id: EventId) -> None:
        self._events.pop(event_id, None)
