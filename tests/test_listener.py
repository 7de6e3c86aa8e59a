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
