"""Who may see and cancel whose tasks, with OAuth identities (real HTTP, a throwaway OpenID
provider): a team claim lets members read (not cancel) each other's tasks; `tasks:admin` reads
and cancels every task, and the task's audit says who did; everyone else gets exactly the
answer an unknown task gets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
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


async def test_an_admin_lists_everyones_tasks_page_by_page_each_with_its_owner_and_audited(
        server: Any, idp: FakeIdP) -> None:
    """list_tasks(everyone=true): every owner's tasks newest first, paged, filtered like a list of
    one's own, each row naming its owner; each listed task's audit says which admin listed it
    (once however often). Without tasks:admin it is refused as everyone's usage is (FORBIDDEN)."""
    people = People(idp, server.url)
    root, alice_owner, bob_owner = people.owner("root"), people.owner("alice"), people.owner("bob")
    async with people.client("alice") as a, people.client("bob") as b, \
            people.client("root", scopes=["tasks:admin"]) as r, people.client("eve", team="ops") as e:
        alice, bob, admin, eve = Agent(a), Agent(b), Agent(r), Agent(e)
        submitted = []  # (task id, owner), oldest first
        for agent, owner, tags in [(alice, alice_owner, ["x"]), (bob, bob_owner, []), (alice, alice_owner, []),
                                   (bob, bob_owner, ["x"]), (alice, alice_owner, ["y"])]:
            submitted.append((await agent.submit("lj_relax" if tags == ["y"] else "exercise", tags=tags,
                                                 inputs={"n_atoms": 4, "max_steps": 1} if tags == ["y"] else {}),
                              owner))
        for tid, owner in submitted:
            await (alice if owner == alice_owner else bob).wait(tid)
        newest_first = list(reversed(submitted))

        seen, cursor, pages = [], None, 0
        while True:
            page = await admin.call("list_tasks", everyone=True, limit=2, **({"cursor": cursor} if cursor else {}))
            seen += [(t["task_id"], t["owner"]) for t in page["tasks"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == newest_first and pages == 3
        tagged = await admin.call("list_tasks", everyone=True, tags_any=["x"])
        assert [(t["task_id"], t["owner"]) for t in tagged["tasks"]] == [newest_first[1], newest_first[4]]
        by_tool = await admin.call("list_tasks", everyone=True, tool_name="lj_relax")
        assert [t["task_id"] for t in by_tool["tasks"]] == [newest_first[0][0]]
        done = await admin.call("list_tasks", everyone=True, states=["succeeded", "failed"])
        assert {t["task_id"] for t in done["tasks"]} <= {tid for tid, _ in submitted}
        assert (await admin.call("list_tasks", everyone=True, states=["queued"]))["tasks"] == []

        for plain in (alice, eve):  # an owner, a team member: neither may
            err = await plain.error("list_tasks", everyone=True)
            assert err["code"] == "FORBIDDEN" and "tasks:admin" in err["message"], err
        both = await admin.error("list_tasks", everyone=True, owner=alice_owner)
        assert both["code"] == "INVALID_REQUEST"
        # listing one other owner's tasks is an admin read too
        assert len((await admin.call("list_tasks", owner=bob_owner))["tasks"]) == 2

    for tid, _ in submitted:
        listed = [ev for ev in server.cp.store.logs.events(tid) if ev.kind == "admin_list"]
        assert [ev.detail for ev in listed] == [{"by": root}], (tid, listed)  # (pages and filters: once)


def test_the_admin_list_walks_the_primary_key_without_sorting(cp: ControlPlane) -> None:
    """Each filter of list_tasks(everyone=true) reads the tasks along their primary key, newest
    first, and stops after the page: no engine sorts what matches (5,000 tasks of 50 owners, a
    third of them tagged, analyzed, as a planner sees a table in use; a rare tag may be read
    from its own rows, and its few tasks sorted, which is as cheap)."""
    from sqlalchemy import insert, select, text

    from controlplane import api
    from controlplane.store import queries as q

    cp.service.submit(cp.settings.default_owner, api.SubmitTask(tool_name="exercise", tags=["t"]))
    with cp.db.engine.begin() as c:
        row = dict(c.execute(select(q.T)).mappings().one())
        row.pop("pk")
        c.execute(insert(q.T), [{**row, "task_id": f"tsk_{i:026d}", "owner": f"o{i % 50}", "idempotency_key": None,
                                 "state": ("queued", "succeeded", "running")[i % 3],
                                 "submitted_at": row["submitted_at"] + i} for i in range(5000)])
        tasks = c.execute(select(q.T.c.pk, q.T.c.owner, q.T.c.submitted_at).where(q.T.c.task_id.like("tsk_0%"))).all()
        c.execute(insert(q.TAGS), [{"task_pk": pk, "tag": "t", "owner": owner, "submitted_at": at}
                                   for pk, owner, at in tasks if pk % 3 == 0])
        c.execute(text("ANALYZE"))
    base: dict[str, Any] = dict(states_=None, tool_name=None, tags_any=None, submitted_after=None,
                                submitted_before=None, after_pk=None, limit=51)
    with cp.db.engine.connect() as c:
        for extra in ({}, {"states_": ["queued"]}, {"states_": ["queued", "running"]}, {"tool_name": "exercise"},
                      {"tags_any": ["t", "u"]}, {"after_pk": 2000, "submitted_after": 1.0}):
            stmt = q.everyone_page(**{**base, **extra})
            sql = str(stmt.compile(dialect=cp.db.engine.dialect, compile_kwargs={"literal_binds": True}))
            plan = " | ".join(str(r[-1] if cp.db.is_sqlite else r[0]) for r in c.exec_driver_sql("EXPLAIN " * (
                not cp.db.is_sqlite) + "EXPLAIN QUERY PLAN " * cp.db.is_sqlite + sql))
            assert "SORT" not in plan.upper() and "TEMP B-TREE" not in plan.upper(), (extra, plan)
            tasks_read = plan.split("SUBQUERY")[0].split("SubPlan")[0]
            if cp.db.is_sqlite:
                assert tasks_read.startswith(("SCAN tasks |", "SEARCH tasks USING INTEGER PRIMARY KEY")) \
                    or tasks_read.strip() == "SCAN tasks", (extra, plan)
            else:
                assert "Index Scan Backward using tasks_pkey" in tasks_read, (extra, plan)
