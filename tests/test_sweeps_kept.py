"""What is kept of a sweep, and who saw it: a sweep's row stays while any of its shards is on file
and is purged (in bounded batches) once the last is; an administrator's read of another caller's
sweep is in the sweep's audit, as its reads of tasks are in theirs. On both engines."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, serving
from tests.oidc import FakeIdP

pytestmark = pytest.mark.anyio
LATER = itertools.count()
OWN = ["tasks:submit", "tasks:read", "tasks:cancel"]


def expire_shards(cp: ControlPlane, sweep_id: str, shards: list[int]) -> None:
    """These shards (ended) past their ttl."""
    with cp.db.write() as c:
        c.execute(text("UPDATE tasks SET expires_at = :e WHERE sweep_id = :s AND shard = :i"),
                  [{"e": time.time() - 60, "s": sweep_id, "i": i} for i in shards])


def cycles(cp: ControlPlane) -> list[int]:
    """Retention cycles until nothing is left; the sweeps each purged."""
    out = []
    for k in range(20):
        swept = cp.reconciler.retention.sweep(time.time() + 601 * next(LATER))  # (each one's purge is due)
        out.append(swept.sweeps_purged)
        if not swept.more and k:
            return out
    raise AssertionError("retention never caught up")


async def test_a_sweep_stays_while_a_shard_is_on_file_and_goes_after_the_last(home: Path) -> None:
    cp = ControlPlane(Settings(home=home, **{**FAST, "retention_batch": 2, "retention_cycle_s": 0,
                                             "purge_after_s": 0}))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        made = [await agent.call("submit_sweep", tool_name="exercise", max_parallel=1,
                                 vary={"list": [{"sleep_s": 30}] * 3}) for _ in range(3)]
        ids = [m["sweep_id"] for m in made]
        for sid in ids:
            await agent.call("cancel_sweep", sweep_id=sid)
        for sid in ids:  # every shard ended (the reconciler stops a running one's job)
            deadline = time.monotonic() + 30
            while not (await agent.call("get_sweep_status", sweep_id=sid))["done"]:
                assert time.monotonic() < deadline
                await anyio.sleep(0.1)

        for sid in ids:
            expire_shards(cp, sid, [0, 1])  # shard 2 of each is still within its ttl
        assert sum(cycles(cp)) == 0
        for sid in ids:
            st = await agent.call("get_sweep_status", sweep_id=sid)
            assert st["shards"] == 3 and st["counts"] == {"cancelled": 1}  # two purged, one kept

        for sid in ids:
            expire_shards(cp, sid, [2])
        purged = cycles(cp)
        assert sum(purged) == 3 and max(purged) <= 2  # in batches of retention_batch
        for sid in ids:
            assert await agent.error("get_sweep_status", sweep_id=sid) == {"code": "NOT_FOUND",
                                                                            "message": "sweep not found"}
        assert cp.store.sweeps.get(ids[0]) is None


@pytest.fixture
async def server(home: Path, idp: FakeIdP) -> AsyncIterator[Any]:
    cp = ControlPlane(Settings(home=home, auth_issuer=idp.issuer, auth_jwks_uri=idp.jwks_uri, auth_team_claim="team",
                               **FAST))
    async with serving(cp) as srv:
        srv.cp = cp
        yield srv


async def test_an_admins_read_of_another_callers_sweep_is_audited(server: Any, idp: FakeIdP) -> None:
    def client(sub: str, scopes: list[str], mode: str = "auto") -> Client:
        return Client(server.url, auth=idp.token(sub, audience=server.url, scopes=scopes), mode=mode)

    async with client("alice", OWN) as a, client("root", ["tasks:admin"]) as r:
        alice, admin = Agent(a), Agent(r)
        sid = (await alice.call("submit_sweep", tool_name="exercise", vary={"list": [{}, {}]}))["sweep_id"]
        await alice.call("get_sweep_status", sweep_id=sid)  # its owner's read
        for _ in range(2):  # the same admin again soon after: one entry
            await admin.call("get_sweep_status", sweep_id=sid)
        await admin.call("get_sweep_result", sweep_id=sid)
    reads = [e for e in server.cp.store.logs.events(sid) if e.kind.startswith("admin")]
    assert [(e.kind, e.detail) for e in reads] == [("admin_read", {"by": f"{idp.issuer}#root"})]
