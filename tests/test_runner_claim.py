"""The job's spec holds no lasting secret: a runner trades its one-time bootstrap token for its
attempt's callback secret, once, with a nonce of its own. A copy of the token read later (from a
process's environment here, from DescribeJobs or executions.get in the cloud) buys nothing."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from sqlalchemy import update

from controlplane.ids import AttemptRef
from controlplane.launch import bootstrap_token, runner_secret
from controlplane.objectstore.claim import claim_key, nonce_digest, take_claim
from controlplane.store.models import Job
from controlplane_runner.claim import CLAIM_LOST, CLAIM_REFUSED, CLAIM_UNAVAILABLE
from tests.conftest import Agent

pytestmark = pytest.mark.anyio


def runner_env(cp, tid: str) -> dict[str, str]:  # noqa: ANN001
    """What anyone able to read the job's spec sees: the runner process's environment."""
    import json

    pid = json.loads((Path(cp.settings.home) / "jobs" / cp.store.jobs.get(AttemptRef(tid, 1)).job_name / "runner.pid").read_text())["pid"]
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
    secret = runner_secret(cp.secret_key, AttemptRef(tid, 1))
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


async def claimed_by_its_runner(cp, tid: str) -> None:  # noqa: ANN001
    """Until the real runner has claimed its attempt (it does so before its tool starts)."""
    for _ in range(600):
        job = cp.store.jobs.get(AttemptRef(tid, 1))
        if job is not None and job.secret_claim:
            return
        await anyio.sleep(0.05)
    raise AssertionError("the runner never claimed its attempt")


def forget_claim(cp, tid: str) -> None:  # noqa: ANN001
    """Forget the real runner's claim (database and object store), so a test makes the first one."""
    with cp.db.engine.begin() as c:
        c.execute(update(Job.__table__).where(Job.__table__.c.task_id == tid).values(secret_claim=None))
    cp.object_stores.get(cp.store.tasks.get(tid).store_url).delete_prefix(claim_key(AttemptRef(tid, 1)))


async def test_claim_answers(agent: Agent, cp) -> None:
    """A bad token is 401, a bad body 400, the first nonce wins (and may ask again), any other
    nonce is 403 ALREADY_CLAIMED, and an attempt that is over is 409 ATTEMPT_OVER."""
    tid = await agent.submit(inputs={"sleep_s": 30})
    await claimed_by_its_runner(cp, tid)
    forget_claim(cp, tid)
    base = f"{cp.public_url}/runner/v1/tasks/{tid}/attempts/1/claim"
    token = {"Authorization": f"Bearer {bootstrap_token(cp.secret_key, AttemptRef(tid, 1))}"}
    mine, theirs = secrets.token_hex(32), secrets.token_hex(32)
    async with httpx.AsyncClient() as http:
        assert (await http.post(base, json={"nonce": mine},
                                headers={"Authorization": "Bearer " + runner_secret(cp.secret_key, AttemptRef(tid, 1))})).status_code == 401
        assert (await http.post(base, json={"nonce": "short"}, headers=token)).status_code == 400
        assert (await http.post(base, content=b"not json", headers=token)).status_code == 400
        first = await http.post(base, json={"nonce": mine}, headers=token)
        assert first.status_code == 200 and first.json() == {"secret": runner_secret(cp.secret_key, AttemptRef(tid, 1))}
        assert first.headers["cache-control"] == "no-store"
        assert (await http.post(base, json={"nonce": mine}, headers=token)).json() == first.json()  # a lost answer
        other = await http.post(base, json={"nonce": theirs}, headers=token)
        assert (other.status_code, other.json()["code"]) == (403, "ALREADY_CLAIMED")
        await agent.call("cancel_task", task_id=tid)
        await agent.wait(tid)
        over = await http.post(base, json={"nonce": mine}, headers=token)
        assert (over.status_code, over.json()["code"]) == (409, "ATTEMPT_OVER")


async def test_a_claim_the_runner_took_in_the_object_store_wins_over_a_later_one(agent: Agent, cp) -> None:
    """A runner that could not reach the control plane claimed the attempt in the object store:
    the control plane then refuses every other nonce, and answers the holder's."""
    tid = await agent.submit(inputs={"sleep_s": 30})
    await claimed_by_its_runner(cp, tid)
    forget_claim(cp, tid)
    holder = secrets.token_hex(32)
    store = cp.object_stores.get(cp.store.tasks.get(tid).store_url)
    assert take_claim(store, AttemptRef(tid, 1), nonce_digest(holder), by="runner") == nonce_digest(holder)
    base = f"{cp.public_url}/runner/v1/tasks/{tid}/attempts/1/claim"
    token = {"Authorization": f"Bearer {bootstrap_token(cp.secret_key, AttemptRef(tid, 1))}"}
    async with httpx.AsyncClient() as http:
        late = await http.post(base, json={"nonce": secrets.token_hex(32)}, headers=token)
        assert (late.status_code, late.json()["code"]) == (403, "ALREADY_CLAIMED")
        back = await http.post(base, json={"nonce": holder}, headers=token)  # the holder reaches us again
        assert back.status_code == 200 and back.json() == {"secret": runner_secret(cp.secret_key, AttemptRef(tid, 1))}
    await agent.call("cancel_task", task_id=tid)
    await agent.wait(tid)


def run_second(env: dict[str, str], tmp_path: Path, **extra: str) -> tuple[int, str, Path]:
    """Start another execution of an attempt by hand, with `env` (a job's environment): the
    tool it wraps would leave a file behind. (exit status, console, that file)."""
    marker = tmp_path / f"ran-{secrets.token_hex(4)}"
    tool = f"open({str(marker)!r}, 'a').write('ran')"
    proc = subprocess.run([sys.executable, "-m", "controlplane_runner", "--job-name", "second", "--",
                           sys.executable, "-c", tool],
                          env={**env, **extra}, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr, marker


async def test_a_second_execution_of_an_attempt_exits_without_running_the_tool(agent: Agent, cp, tmp_path: Path) -> None:
    """Another execution of a running attempt (a relaunch by a paused leader, a cloud's retry)
    is refused its claim and ends at once with CLAIM_LOST, saying so; its tool never runs and
    the first execution finishes as if nothing happened."""
    tid = await agent.submit(inputs={"sleep_s": 2, "result": {"first": True}})
    await claimed_by_its_runner(cp, tid)
    env = runner_env(cp, tid)
    status, console, marker = await anyio.to_thread.run_sync(run_second, env, tmp_path)
    assert status == CLAIM_LOST, console
    assert "already claimed by another execution" in console and "the tool was not run" in console
    assert not marker.exists()
    st = await agent.wait(tid)
    assert st["state"] == "succeeded" and st["attempt"] == 1
    assert (await agent.call("get_task_result", task_id=tid))["result"]["first"] is True
    # refused token: told apart from a claim someone else holds
    status, console, marker = await anyio.to_thread.run_sync(
        lambda: run_second(env, tmp_path, CONTROLPLANE_BOOTSTRAP_TOKEN="0" * 64))
    assert status == CLAIM_REFUSED and "refused" in console and not marker.exists()


async def test_with_the_control_plane_unreachable_the_object_store_keeps_the_claim_single(agent: Agent, cp,
                                                                                            tmp_path: Path) -> None:
    """Executions that cannot reach the control plane claim the attempt in the object store: one
    runs the tool, the others end with CLAIM_LOST; a job with no storage access of its own cannot
    claim and runs nothing (CLAIM_UNAVAILABLE)."""
    tid = await agent.submit(inputs={"sleep_s": 30})
    await claimed_by_its_runner(cp, tid)
    forget_claim(cp, tid)
    env = runner_env(cp, tid)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/runner/v1"
    down = dict(CONTROLPLANE_CALLBACK_URL=dead, CONTROLPLANE_CLAIM_WAIT_S="1", CONTROLPLANE_ENDPOINT_FILE="")
    first = await anyio.to_thread.run_sync(lambda: run_second(env, tmp_path, **down))
    second = await anyio.to_thread.run_sync(lambda: run_second(env, tmp_path, **down))
    assert first[0] == 0 and first[2].read_text() == "ran", first[1]
    assert "claimed" in first[1] and "in the object store" in first[1]
    assert second[0] == CLAIM_LOST and not second[2].exists(), second[1]
    granted = await anyio.to_thread.run_sync(
        lambda: run_second(env, tmp_path, **down, CONTROLPLANE_STORE_ACCESS="grants"))
    assert granted[0] == CLAIM_UNAVAILABLE and not granted[2].exists(), granted[1]
    await agent.call("cancel_task", task_id=tid)
    await agent.wait(tid)
