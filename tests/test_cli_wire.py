"""The command line's calls to a running server: over MCP's stateless HTTP wire with no MCP
library imported (what made a 1 KiB `put` take seconds), a refused token still said plainly, and
through fastmcp's client when a server refuses that wire (a proxy in front of the real server
turns its requests away as a server of the handshake versions only would)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.conftest import FAST, ROOT, serving
from tests.test_uploads import reference, user_env

pytestmark = pytest.mark.anyio
HEAVY = ("fastmcp", "mcp", "mcp_types", "sqlalchemy", "sqlmodel", "boto3", "botocore", "google", "azure")


async def cli(*args: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "controlplane.cli", *args]
    return await anyio.to_thread.run_sync(lambda: subprocess.run(
        cmd, env={**user_env(), "COLUMNS": "200"}, cwd=ROOT, capture_output=True, text=True, timeout=300))


def imported(stderr: str) -> set[str]:
    """The top-level names of the modules `-X importtime` saw imported."""
    return {m.group(1).split(".")[0] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)$", stderr, re.M)}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:  # the client side is the point: SQLite alone
    return Settings(home=tmp_path / "home", **FAST, auth_tokens="tok-a=alice")


async def test_put_get_and_help_import_no_mcp_library_or_database(settings: Settings, tmp_path: Path) -> None:
    body = tmp_path / "small.bin"
    body.write_bytes(b"x" * 1024)
    async with serving(ControlPlane(settings)) as server:
        done = await cli("put", str(body), "--url", server.url, "--token", "tok-a", importtime=True)
        ref = reference(done)
        assert not imported(done.stderr) & set(HEAVY), sorted(imported(done.stderr) & set(HEAVY))
        shown = await cli("tasks", "list", "--url", server.url, "--token", "tok-a", importtime=True)
        assert shown.returncode == 0 and not imported(shown.stderr) & set(HEAVY), shown.stderr[-2000:]
        refused = await cli("put", str(body), "--url", server.url, "--token", "nope")
        assert refused.returncode == 4 and "401 Unauthorized" in refused.stderr, refused.stderr
        missing = await cli("get", "artifact://tsk_00000000000000000000000000/x.bin", "--url", server.url,
                            "--token", "tok-a")
        assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr, missing.stderr
    helped = await cli("--help", importtime=True)
    assert helped.returncode == 0 and not imported(helped.stderr) & set(HEAVY), sorted(imported(helped.stderr) & set(HEAVY))
    assert ref.startswith("upl_")


@contextmanager
def handshake_only(target: str) -> Iterator[tuple[str, list[str]]]:
    """A proxy to `target` on 127.0.0.1 that answers 400 to every request of the stateless
    versions (as a server that speaks only the handshake ones) and 405 to GET (no standalone
    stream); the rest it forwards. Its URL, and the protocol versions of the requests it took."""
    taken: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def forward(self) -> None:
            version = self.headers.get("mcp-protocol-version") or ""
            if version.startswith("2026"):
                self.answer(400, b"", "text/plain")
                return
            taken.append(version)
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            req = urllib.request.Request(target, data=body or None, method=self.command,
                                         headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    self.answer(r.status, r.read(), r.headers.get("content-type") or "", r.headers)
            except urllib.error.HTTPError as e:
                self.answer(e.code, e.read(), e.headers.get("content-type") or "", e.headers)

        def answer(self, status: int, data: bytes, kind: str, headers: Any = None) -> None:
            self.send_response(status)
            for k in ("mcp-session-id", "mcp-protocol-version"):
                if headers is not None and headers.get(k):
                    self.send_header(k, headers[k])
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_DELETE = forward

        def do_GET(self) -> None:
            self.answer(405, b"", "text/plain")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp", taken
    finally:
        server.shutdown()
        server.server_close()


async def test_a_server_that_refuses_the_stateless_wire_is_called_through_a_session(settings: Settings,
                                                                                    tmp_path: Path) -> None:
    body = tmp_path / "data.bin"
    body.write_bytes(b"through a session" * 100)
    async with serving(ControlPlane(settings)) as server:
        with handshake_only(server.url) as (url, taken):
            done = await cli("put", str(body), "--url", url, "--token", "tok-a")
            ref = reference(done)
        assert taken and not [v for v in taken if v.startswith("2026")], taken
        listed = await cli("tasks", "list", "--url", server.url, "--token", "tok-a")
        assert listed.returncode == 0, listed.stderr
    assert ref.startswith("upl_")
