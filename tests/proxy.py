"""An HTTP proxy on 127.0.0.1 in front of an emulator: it forwards each request as it came and
records what passed. A subclass may answer a request itself (`answer`: a fault, a lost answer)."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Answer = tuple[int, list[tuple[str, str]], bytes]  # status, headers, body
HOP_BY_HOP = ("host", "connection", "transfer-encoding", "content-length")


class Proxy:
    def __init__(self, target: str):
        self.target = urlsplit(target)
        self.requests: list[tuple[float, str, str]] = []  # (monotonic time, method, path and query)
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with proxy.lock:
                    proxy.requests.append((time.monotonic(), self.command, self.path))
                status, headers, data = proxy.answer(self.command, self.path, list(self.headers.items()), body)
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
        """What the client gets: the target's answer (override to answer otherwise)."""
        return self.forward(method, path, headers, body)

    def forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
        conn = http.client.HTTPConnection(self.target.hostname or "127.0.0.1", self.target.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={k: v for k, v in headers if k.lower() not in HOP_BY_HOP[:2]})
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
