"""Reading a request's body ahead of the app that answers it, and handing it back.

The scope check (`http.scopes`, 2025-11-25: the operation is in the body) and the JSON router
(`http.quiet_json`: whether a call may stream) both look at a POST's JSON-RPC body before the
SDK's app reads it again.
"""

from __future__ import annotations

from starlette.types import Message, Receive


async def read_body(receive: Receive) -> tuple[bytes, bool, Receive]:
    """(body, complete, receive): the whole body (`complete` False when the client went away
    before it all came), and a receive() that gives back what was read, then reads on."""
    chunks: list[bytes] = []
    pending: Message | None = None
    while True:
        message = await receive()
        if message["type"] != "http.request":  # gone before the body arrived
            pending = message
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    queue: list[Message] = [] if pending is not None and not chunks else [
        {"type": "http.request", "body": body, "more_body": False}]
    if pending is not None:
        queue.append(pending)

    async def replay() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return body, pending is None, replay
