"""Subscribing to `task://{task_id}`: the owner hears each change of the task (coalesced to at
most 4 a second) and reads the resource again; anybody else's subscription is accepted and silent.
2026-07-28 through `subscriptions/listen` (the `mcp` SDK client), 2025-11-25 through
`resources/subscribe` (fastmcp's client in legacy mode), both over real HTTP."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.messages import MessageHandler
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from controlplane.app import ControlPlane
from controlplane.mcp.subscriptions import MAX_URIS_PER_LISTEN
from controlplane.settings import Settings
from controlplane.states import TERMINAL
from tests.conftest import FAST, Agent, most_in_one_second, serving

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

# ~3 s of work reported in 30 steps: far more changes than 4 a second
WORK = {"progress_steps": 30, "sleep_s": 3}


@pytest.fixture
def cp(home: Path) -> ControlPlane:
    return ControlPlane(Settings(home=home, auth_tokens="tok-alice=alice,tok-bob=bob", **FAST))


def sdk_client(url: str, token: str) -> Any:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    return http, mcp.Client(streamable_http_client(url, http_client=http))


async def state_of(client: Any, uri: str) -> str:
    read = await client.read_resource(uri)  # fastmcp answers the contents, the SDK the result
    doc = json.loads((read if isinstance(read, list) else read.contents)[0].text)
    return doc["status"]["state"]


async def test_listen_streams_the_owners_task_changes(cp: ControlPlane) -> None:
    async with serving(cp) as server, Client(server.url, auth="tok-alice") as alice_fm, \
            Client(server.url, auth="tok-bob") as bob_fm:
        mine = (await Agent(alice_fm).call("exercise", **WORK))["task_id"]
        theirs = (await Agent(bob_fm).call("exercise", sleep_s=0.5, progress_steps=5))["task_id"]
        uri, foreign = f"task://{mine}", f"task://{theirs}"
        http, alice = sdk_client(server.url, "tok-alice")
        async with http, alice:
            assert alice.server_capabilities.resources.subscribe is True
            arrivals: list[float] = []
            uris: set[str] = set()
            async with alice.listen(resource_subscriptions=[uri, foreign, "task://nope"]) as sub:
                assert set(sub.honored.resource_subscriptions or ()) == {uri, foreign, "task://nope"}
                state = await state_of(alice, uri)  # refetch after the ack, as the spec asks
                with anyio.fail_after(60):
                    async for event in sub:
                        arrivals.append(time.monotonic())
                        uris.add(event.uri)
                        state = await state_of(alice, uri)
                        if state in TERMINAL:
                            break
            assert state == "succeeded"
            assert uris == {uri}, "only the caller's own task may fire"
            assert 3 <= len(arrivals) < 30, "changes arrive, coalesced"
            assert most_in_one_second(arrivals) <= 5  # 4 a second, plus arrival jitter


async def test_listen_refuses_too_many_uris_and_stays_usable(cp: ControlPlane) -> None:
    async with serving(cp) as server:
        http, alice = sdk_client(server.url, "tok-alice")
        async with http, alice:
            too_many = [f"task://t{i}" for i in range(MAX_URIS_PER_LISTEN + 1)]
            with pytest.raises(MCPError) as e:
                async with alice.listen(resource_subscriptions=too_many):
                    pass
            assert e.value.error.code == mcp_types.INVALID_PARAMS
            assert str(MAX_URIS_PER_LISTEN) in e.value.error.message
            await alice.list_tools()


class Updates(MessageHandler):
    def __init__(self) -> None:
        self.uris: list[str] = []
        self.arrivals: list[float] = []
        self.event = anyio.Event()

    async def on_resource_updated(self, message: mcp_types.ResourceUpdatedNotification) -> None:
        self.uris.append(str(message.params.uri))
        self.arrivals.append(time.monotonic())
        self.event.set()
        self.event = anyio.Event()


async def test_legacy_subscribe_notifies_the_owner_until_unsubscribed(cp: ControlPlane) -> None:
    mine_heard, bob_heard = Updates(), Updates()
    async with serving(cp) as server, \
            Client(server.url, auth="tok-alice", mode="legacy", message_handler=mine_heard) as alice, \
            Client(server.url, auth="tok-bob", mode="legacy", message_handler=bob_heard) as bob:
        assert alice.initialize_result.capabilities.resources.subscribe is True
        mine = (await Agent(alice).call("exercise", **WORK))["task_id"]
        uri = f"task://{mine}"
        await alice.session.subscribe_resource(uri)
        await alice.session.subscribe_resource(uri)  # twice is once
        await bob.session.subscribe_resource(uri)  # someone else's task: accepted, silent
        await bob.session.subscribe_resource("task://nope")
        state = await state_of(alice, uri)
        with anyio.fail_after(60):
            while state not in TERMINAL:
                await mine_heard.event.wait()
                state = await state_of(alice, uri)
        assert state == "succeeded"
        assert set(mine_heard.uris) == {uri}
        assert 3 <= len(mine_heard.uris) < 30
        assert most_in_one_second(mine_heard.arrivals) <= 5
        assert bob_heard.uris == []

        # after unsubscribing, the task's changes are no longer heard
        second = (await Agent(alice).call("exercise", sleep_s=4, progress_steps=20))["task_id"]
        await alice.session.subscribe_resource(f"task://{second}")
        await Agent(alice).wait(second, {"running"})
        await alice.session.unsubscribe_resource(f"task://{second}")
        await anyio.sleep(0.5)  # a notification already on its way lands
        heard = len(mine_heard.uris)
        assert (await Agent(alice).call("get_task_status", task_id=second))["state"] == "running"
        await Agent(alice).wait(second)
        await anyio.sleep(0.5)
        assert mine_heard.uris[heard:] == []
