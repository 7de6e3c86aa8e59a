"""The HTTP listener: bound up front to a known URL, and TCP so that responses are not delayed."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from controlplane.app import ControlPlane
from controlplane.http.listener import Listener
from controlplane.settings import Settings


def test_listener_is_bound_before_serving_and_says_it_is_tcp() -> None:
    listener = Listener("127.0.0.1", 0)
    try:
        port = listener.sock.getsockname()[1]
        assert listener.url == f"http://127.0.0.1:{port}"
        # asyncio only sets TCP_NODELAY on accepted sockets of a listener whose proto is TCP;
        # with proto 0 every small response waits ~40 ms on Nagle and delayed ACKs.
        assert listener.sock.proto == socket.IPPROTO_TCP
        assert not listener.sock.get_inheritable()  # runners do not inherit it
    finally:
        listener.sock.close()


@pytest.mark.anyio
async def test_control_planes_run_one_after_another_in_one_loop(tmp_path: Path) -> None:
    """Leaving `running()` stops the internal listener gracefully: a listener started later in the
    same event loop (possibly on the same fd number) answers."""
    planes = [ControlPlane(Settings(home=tmp_path / name)) for name in ("first", "second", "third")]
    for cp in planes:
        async with cp.running():
            async with httpx.AsyncClient(timeout=5) as http:
                assert (await http.get(f"{cp.public_url}/healthz")).status_code == 200


@pytest.mark.anyio
async def test_an_idle_connection_outlasts_uvicorns_default_keep_alive() -> None:
    """A load balancer (our AWS ALB keeps idle connections 300 s) or a client reuses a connection
    it believes open; uvicorn closed idle ones after 5 s, so a request sent just then failed (a 502
    at the balancer, "connection closed" at the client). Ours stay open for KEEP_ALIVE_S."""
    import asyncio

    from controlplane.http.listener import KEEP_ALIVE_S

    assert KEEP_ALIVE_S > 600  # above Google's load balancers' 600 s, AWS's and Azure's
    calls = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    listener = Listener("127.0.0.1", 0)
    served = asyncio.create_task(listener.serve(app))
    try:
        while not listener.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.sock.getsockname()[1])

        async def ask(path: str) -> bytes:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            return head + await asyncio.wait_for(reader.readexactly(2), 5)

        assert (await ask("/first")).endswith(b"ok")
        await asyncio.sleep(5.6)  # idle past uvicorn's default timeout_keep_alive (5 s)
        second = await ask("/second")  # on the same connection: EOF here if the server had closed it
        assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"ok")
        assert calls == ["/first", "/second"]
        writer.close()
    finally:
        listener.stop()
        await served
