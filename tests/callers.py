"""Two callers, alice and bob, each with a bearer token of their own: the tokens a server is
started with, and the `alice` and `bob` fixtures, each an MCP client over HTTP to the module's
`server` fixture (which `token_server` starts). A module imports the fixtures it uses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from tests.conftest import Agent, ServerProcess, fast_env

ALICE, BOB = "tok-alice", "tok-bob"
TOKENS = f"{ALICE}=alice,{BOB}=bob"  # CONTROLPLANE_AUTH_TOKENS


def token_server(server_process: ServerProcess, home: Path, **env: Any) -> ServerProcess:
    """`controlplane serve` in a subprocess that knows both tokens (and `env`'s settings)."""
    server_process.env = fast_env(home, auth_tokens=TOKENS, **env)
    return server_process.start()


@asynccontextmanager
async def caller(url: str, token: str) -> AsyncIterator[Agent]:
    """An MCP client to `url` with `token`, used as an agent uses it."""
    async with Client(url, auth=token) as c:
        yield Agent(c)


@pytest.fixture
async def alice(server: ServerProcess) -> AsyncIterator[Agent]:
    async with caller(server.url, ALICE) as agent:
        yield agent


@pytest.fixture
async def bob(server: ServerProcess) -> AsyncIterator[Agent]:
    async with caller(server.url, BOB) as agent:
        yield agent
