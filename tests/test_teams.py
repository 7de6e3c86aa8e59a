"""Who may see and cancel whose tasks, with OAuth identities (real HTTP, a throwaway OpenID
provider): a team claim lets members read (not cancel) each other's tasks; `tasks:admin` reads
and cancels every task, and the task's audit says who did; everyone else gets exactly the
answer an unknown task gets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, serving
from tests.oidc import FakeIdP
from tests.wire import modern_request

pytestmark = pytest.mark.anyio

OWN = ["tasks:submit", "tasks:read", "tasks:cancel"]
UNKNOWN_ID = "tsk_" + "a" * 26


@pytest.fixture
def idp() -> Iterator[FakeIdP]:
    provider = FakeIdP().start()
    yield provider
    provider.stop()


@pytest.fixture
async def server(home: Path, idp: FakeIdP) -> AsyncIterator[Any]:
    cp = ControlPlane(Settings(home=home, auth_issuer=idp.issuer, auth_jwks_uri=idp.jwks_uri, auth_team_claim="team",
                               **FAST))
    async with serving(cp) as srv:
        srv.cp = cp
        yield srv


class People:
    def __init__(self, idp: FakeIdP, url: str):
        self.idp, self.url = idp, url

    def owner(self, sub: str) -> str:
        return f"{self.idp.issuer}#{sub}"

    def client(self, sub: str, *, team: str | list[str] | None = None, scopes: list[str] = OWN,
               mode: str = "auto") -> Client:
        return Client(self.url, auth=self.idp.token(sub, audience=self.url, scopes=scopes, team=team), mode=mode)


async def raw_error(agent: Agent, tool: str, **args: Any) -> str:
    res = await agent.client.call_tool(tool, args, raise_on_error=False)
    assert res.is_error, res
    return res.content[0].text


async def test_team_members_read_each_others_tasks_but_do_not_cancel_them(server: Any, idp: FakeIdP) -> None:
    people = People(idp, server.url)
    async with people.client("alice", team="red") as a, people.client("carol", team=["red", "green"]) as c, \
            people.client("bob", team="blue") as b, people.client("alice") as a_alone:
        alice, carol, bob = Agent(a), Agent(c), Agent(b)
        done = await alice.submit(inputs={"log_lines": 3, "result": {"secret": "red team only"}})
        running = await alice.submit(inputs={"sleep_s": 120, "progress_steps": 120})
        private = await Agent(a_alone).submit()  # submitted with a token naming no team: shared with nobody
        assert (await alice.wait(done))["state"] == "succeeded"
        await alice.wait(running, {"running"})

        # carol (red, and green) reads alice's red tasks like her own ...
        assert (await carol.call("get_task_status", task_id=running))["state"] == "running"
        assert len((await carol.call("tail_task_logs", task_id=done))["lines"]) == 3
        assert (await carol.call("get_task_result", task_id=done))["result"]["secret"] == "red team only"
        assert (await carol.call("wait_task", task_id=done, timeout_s=5))["done"] is True
        doc = json.loads((await c.read_resource(f"task://{done}"))[0].text)
        assert doc["status"]["task_id"] == done
        page = await carol.call("list_tasks", owner=people.owner("alice"))
        assert {t["task_id"] for t in page["tasks"]} == {done, running}  # not `private`
        assert (await carol.call("list_tasks"))["tasks"] == []  # her own: none
        # ... but may not cancel them: she knows the task exists, so she is told why.
        refused = await carol.error("cancel_task", task_id=running)
        assert refused["code"] == "FORBIDDEN"
        st = await alice.call("get_task_status", task_id=running)
        assert st["state"] == "running" and st["cancel_requested"] is False
        # The same through native tasks (2026-07-28): tasks/get answers, tasks/cancel refuses.
        token = idp.token("carol", audience=server.url, scopes=OWN, team="red")
        meta = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as h:
            got = (await h.post(server.url, json=(req := modern_request("tasks/get", {"taskId": done}, meta=meta))[0],
                                headers=req[1])).json()
            assert got["result"]["status"] == "completed"
            assert got["result"]["result"]["structuredContent"]["result"]["secret"] == "red team only"
            no = (await h.post(server.url, json=(req := modern_request("tasks/cancel", {"taskId": running}, meta=meta))[0],
                               headers=req[1])).json()
            assert no["error"]["code"] == -32602 and no["error"]["data"]["code"] == "FORBIDDEN"
        # A task shared with no team stays alice's alone.
        assert (await carol.error("get_task_status", task_id=private))["code"] == "NOT_FOUND"

        # bob (blue) gets exactly what an unknown id gets, for every task and every tool.
        for tool in ("get_task_status", "tail_task_logs", "get_task_result", "cancel_task"):
            unknown = await raw_error(bob, tool, task_id=UNKNOWN_ID)
            assert unknown == '{"code":"NOT_FOUND","message":"task not found"}'
            for tid in (done, running, private):
                assert await raw_error(bob, tool, task_id=tid) == unknown, (tool, tid)
        assert (await bob.call("list_tasks", owner=people.owner("alice")))["tasks"] == []
        assert (await alice.call("get_task_status", task_id=running))["cancel_requested"] is False

        assert (await alice.call("cancel_task", task_id=running))["acknowledged"] is True
    # Members' reads are not admin acts: the audit has none.
    assert not [e for e in server.cp.store.logs.events(done) if e.kind.startswith("admin")]


async def test_an_admin_reads_and_cancels_every_task_and_the_audit_says_who(server: Any, idp: FakeIdP) -> None:
    people = People(idp, server.url)
    root = people.owner("root")
    async with people.client("alice") as a, people.client("root", scopes=["tasks:admin"], mode="legacy") as r:
        alice, admin = Agent(a), Agent(r)
        running = await alice.submit(inputs={"sleep_s": 120, "progress_steps": 120})
        done = await alice.submit(inputs={"log_lines": 1})
        await alice.wait(running, {"running"})
        assert (await alice.wait(done))["state"] == "succeeded"

        assert (await admin.call("get_task_status", task_id=running))["state"] == "running"
        assert (await admin.call("get_task_status", task_id=running))["task_id"] == running  # (audited once)
        listed = await admin.call("list_tasks", owner=people.owner("alice"))
        assert {t["task_id"] for t in listed["tasks"]} == {running, done}
        assert (await admin.call("list_tasks"))["tasks"] == []  # the admin's own

        out = await admin.call("cancel_task", task_id=running, reason="runaway")
        assert out["acknowledged"] is True
        st = await alice.wait(running)
        assert st["state"] == "cancelled"
        assert st["error"]["message"] == "cancelled: by an administrator: runaway"
        late = await admin.call("cancel_task", task_id=done, reason="too late")
        assert late["acknowledged"] is False  # it had ended: nothing changed, and still on record

        out = await alice.call("cancel_task", task_id=running)  # alice's own cancel names nobody
        assert out["acknowledged"] is False

    events = {e.kind: e for e in server.cp.store.logs.events(running)}
    assert events["admin_read"].detail == {"by": root}
    assert events["cancel_requested"].detail == {"reason": "by an administrator: runaway", "by": root}
    assert len([e for e in server.cp.store.logs.events(running) if e.kind == "admin_read"]) == 1
    late_events = [e for e in server.cp.store.logs.events(done) if e.kind == "admin_cancel"]
    assert [e.detail for e in late_events] == [{"reason": "by an administrator: too late", "by": root}]
    assert late_events[0].from_state == late_events[0].to_state == "succeeded"


async def test_without_the_admin_scope_nobody_sees_others_tasks(server: Any, idp: FakeIdP) -> None:
    people = People(idp, server.url)
    async with people.client("alice") as a, people.client("mallory", scopes=OWN + ["tasks:adm"]) as m:
        tid = await Agent(a).submit()
        mallory = Agent(m)
        assert (await mallory.error("get_task_status", task_id=tid))["code"] == "NOT_FOUND"
        assert (await mallory.error("cancel_task", task_id=tid))["code"] == "NOT_FOUND"
        assert (await mallory.call("list_tasks", owner=people.owner("alice")))["tasks"] == []
