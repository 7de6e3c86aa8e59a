"""One check, run by each cloud provider's test module against its fake with the real runner: a
leader paused past its lease wakes and launches the attempt its successor already launched (the
window no lease fence closes: between its last look at the lease and the provider call). The late
execution must end at once without running the tool, say so on its console, and leave the task's
outcome, logs and result to the first.
"""

from __future__ import annotations

import anyio
import anyio.to_thread

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane_providers.base import Handle, JobPhase, Provider
from controlplane_runner.claim import CLAIM_LOST
from tests.conftest import Agent
from tests.provider_contract import ENDED, wait_for


async def claimed_by_its_runner(cp: ControlPlane, tid: str, attempt: int = 1) -> None:
    for _ in range(1200):
        job = cp.store.jobs.get(AttemptRef(tid, attempt))
        if job is not None and job.secret_claim and job.handle_json:
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"the runner of {tid} never claimed its attempt")


def console_of(provider: Provider, handle: Handle) -> list[str]:
    """The execution's console as the provider's native log shows it (every page)."""
    lines: list[str] = []
    cursor = None
    for _ in range(50):
        page = provider.logs(handle, cursor, 500)
        lines += [line.message for line in page.lines]
        if not page.lines or page.next_cursor in (None, cursor):
            return lines
        cursor = page.next_cursor
    return lines


async def a_late_launch_runs_nothing(cp: ControlPlane, agent: Agent) -> Handle:
    """Launch a running attempt a second time, as a paused leader would; check what a user and an
    operator see. Returns the late execution's handle."""
    tid = await agent.submit(inputs={"sleep_s": 3, "log_lines": 3, "result": {"once": True}})
    await claimed_by_its_runner(cp, tid)
    task, job = cp.store.tasks.get(tid), cp.store.jobs.get(AttemptRef(tid, 1))
    assert task is not None and job is not None
    provider = cp.providers[job.provider]
    late = await anyio.to_thread.run_sync(provider.launch, cp.build_spec(task, job))
    assert late.encode() != provider.handle(job.handle_json).encode()  # a second execution, not the first

    ended = await anyio.to_thread.run_sync(lambda: wait_for(provider, late, ENDED, timeout=60))
    assert ended.phase == JobPhase.FAILED, ended
    assert ended.exit_code in (None, CLAIM_LOST), ended  # not every runner reports the exit code
    for _ in range(100):  # the native log can lag behind the execution's end
        console = await anyio.to_thread.run_sync(console_of, provider, late)
        if any("already claimed by another execution" in line for line in console):
            break
        await anyio.sleep(0.1)
    else:
        raise AssertionError(f"the late execution did not say why it ended: {console}")
    assert not any(line.startswith("line ") for line in console), console  # the tool never ran there

    st = await agent.wait(tid, timeout=90)
    assert st["state"] == "succeeded" and st["attempt"] == 1, st
    assert (await agent.call("get_task_result", task_id=tid))["result"]["once"] is True
    assert [ln["message"] for ln in await agent.all_logs(tid)] == ["line 0", "line 1", "line 2"]
    job = cp.store.jobs.get(AttemptRef(tid, 1))  # what `controlplane jobs` shows the operator
    assert job is not None and job.extra_claims == 1, job
    return late


async def a_recorded_execution_refused_its_claim_is_left_for_the_holder(cp: ControlPlane, agent: Agent) -> None:
    """The execution the control plane recorded is the one refused (a late launch claimed first):
    the job follows the execution that holds the claim, which finishes the attempt; nothing is
    stopped that runs the tool, and the task succeeds at its first attempt."""
    from sqlalchemy import update

    from controlplane.store.models import Job

    tid = await agent.submit(inputs={"sleep_s": 4, "log_lines": 3, "result": {"once": True}})
    await claimed_by_its_runner(cp, tid)  # the first execution holds the claim and runs the tool
    task, job = cp.store.tasks.get(tid), cp.store.jobs.get(AttemptRef(tid, 1))
    assert task is not None and job is not None
    provider = cp.providers[job.provider]
    late = await anyio.to_thread.run_sync(provider.launch, cp.build_spec(task, job))
    with cp.db.engine.begin() as c:  # as if the late execution were the one the control plane recorded
        c.execute(update(Job.__table__).where(Job.__table__.c.job_id == job.job_id)
                  .values(handle_json=json_of(late)))
    st = await agent.wait(tid, timeout=90)
    assert st["state"] == "succeeded" and st["attempt"] == 1, st
    assert (await agent.call("get_task_result", task_id=tid))["result"]["once"] is True
    assert [ln["message"] for ln in await agent.all_logs(tid)] == ["line 0", "line 1", "line 2"]
    followed = cp.store.jobs.get(AttemptRef(tid, 1))
    assert followed is not None and provider.same_job(provider.handle(followed.handle_json), provider.handle(job.handle_json))
    assert followed.extra_claims == 1 and followed.extra_stopped == 0, followed


def json_of(handle: Handle) -> str:
    import json

    return json.dumps(handle.encode())
