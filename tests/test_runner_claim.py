"""The job's spec holds no lasting secret: a runner trades its one-time bootstrap token for its
attempt's callback secret, once, with a nonce of its own. A copy of the token read later (from a
process's environment here, from DescribeJobs or executions.get in the cloud) buys nothing."""

from __future__ import annotations

import secrets
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from sqlalchemy import update

from controlplane.launch import bootstrap_token, runner_secret
from controlplane.store.models import Job
from tests.conftest import Agent

pytestmark = pytest.mark.anyio


def runner_env(cp, tid: str) -> dict[str, str]:  # noqa: ANN001
    """What anyone able to read the job's spec sees: the runner process's environment."""
    import json

    pid = json.loads((Path(cp.settings.home) / "jobs" / cp.store.jobs.get(tid, 1).job_name / "runner.pid").read_text())["pid"]
    return psutil.Process(pid).environ()


async def test_the_spec_carries_a_token_that_is_dead_once_the_runner_claimed(agent: Agent, cp) -> None:
    tid = await agent.submit(inputs={"sleep_s": 30, "log_lines": 1})
    await agent.wait(tid, {"running"})
    # A relayed log line proves the runner has claimed its secret (events need it).
    for _ in range(300):
        if await agent.all_logs(tid):
            break
        await anyio.sleep(0.05)
    env = runner_env(cp, tid)
    secret = runner_secret(cp.secret_key, tid, 1)
    assert "CONTROLPLANE_CALLBACK_SECRET" not in env and secret not in env.values()
    token = env["CONTROLPLANE_BOOTSTRAP_TOKEN"]
    base = f"{cp.public_url}/runner/v1/tasks/{tid}/attempts/1"
    async with httpx.AsyncClient() as http:
        stolen = await http.post(f"{base}/claim", json={"nonce": secrets.token_hex(32)},
                                 headers={"Authorization": f"Bearer {token}"})
        assert stolen.status_code == 403 and secret not in stolen.text
        as_secret = await http.post(f"{base}/events", json={"events": []}, headers={"Authorization": f"Bearer {token}"})
        assert as_secret.status_code == 401
    assert (await agent.call("cancel_task", task_id=tid))["state"] == "cancel_requested"
    assert (await agent.wait(tid))["state"] == "cancelled"  # the real runner still heard the cancel


async def test_claim_answers(agent: Agent, cp) -> None:
    """A bad token is 401, a bad body 400, the first nonce wins (and may ask again), any other
    nonce is 403, and an attempt that is over is 409."""
    tid = await agent.submit(inputs={"sleep_s": 30})
    await agent.wait(tid, {"running"})
    with cp.db.engine.begin() as c:  # forget the real runner's claim, so this test makes the first one
        c.execute(update(Job.__table__).where(Job.__table__.c.task_id == tid).values(secret_claim=None))
    base = f"{cp.public_url}/runner/v1/tasks/{tid}/attempts/1/claim"
    token = {"Authorization": f"Bearer {bootstrap_token(cp.secret_key, tid, 1)}"}
    mine, theirs = secrets.token_hex(32), secrets.token_hex(32)
    async with httpx.AsyncClient() as http:
        assert (await http.post(base, json={"nonce": mine},
                                headers={"Authorization": "Bearer " + runner_secret(cp.secret_key, tid, 1)})).status_code == 401
        assert (await http.post(base, json={"nonce": "short"}, headers=token)).status_code == 400
        assert (await http.post(base, content=b"not json", headers=token)).status_code == 400
        first = await http.post(base, json={"nonce": mine}, headers=token)
        assert first.status_code == 200 and first.json() == {"secret": runner_secret(cp.secret_key, tid, 1)}
        assert first.headers["cache-control"] == "no-store"
        assert (await http.post(base, json={"nonce": mine}, headers=token)).json() == first.json()  # a lost answer
        assert (await http.post(base, json={"nonce": theirs}, headers=token)).status_code == 403
        await agent.call("cancel_task", task_id=tid)
        await agent.wait(tid)
        assert (await http.post(base, json={"nonce": mine}, headers=token)).status_code == 409
