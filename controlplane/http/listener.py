"""An ASGI app served by uvicorn on a socket bound up front, so that its URL is known (and can
be handed to runners and put in artifact links) before the server runs."""

from __future__ import annotations

import socket
from typing import Any, Literal


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the listening
    # socket says it is TCP. Without it every small response waits on Nagle + delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)  # runners must not inherit the listening socket
    return sock


class Listener:
    def __init__(self, host: str, port: int):
        self.sock = bind(host, port)
        bound_port = self.sock.getsockname()[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{bound_port}"
        self._server: Any = None
        self._stopped = False

    async def serve(self, app: Any, *, lifespan: Literal["auto", "on", "off"] = "off") -> None:
        import uvicorn

        # log_config=None: uvicorn's records go to the handler `ops.logs` configured, in its format
        config = uvicorn.Config(app, lifespan=lifespan, log_level="warning", access_log=False, log_config=None,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._server.should_exit = self._stopped
        try:
            await self._server.serve(sockets=[self.sock])
        finally:
            self.sock.close()

    @property
    def started(self) -> bool:
        return bool(self._server and self._server.started)

    def stop(self) -> None:
        self._stopped = True
        if self._server is not None:
            self._server.should_exit = True
