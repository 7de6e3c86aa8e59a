"""Artifact names come from jobs and are not trusted: no traversal, no absolute paths, no control
characters, no hidden segments. The runner skips such files with a warning in the task's log,
and the control plane never registers an artifact whose name or key is unsafe or outside the
attempt's own prefix, even from a runner that holds the right secret."""

from __future__ import annotations

import httpx
import pytest

from controlplane.ids import AttemptRef
from controlplane.launch import runner_secret
from tests.conftest import Agent

pytestmark = pytest.mark.anyio


async def test_runner_uploads_safe_names_and_skips_the_rest(agent: Agent, cp) -> None:
    names = ["ok.txt", "nested/dir/ok2.txt", ".hidden", "dir/.secret", "bad\x01name.txt", "../escaped.txt"]
    tid = await agent.submit(inputs={"artifact_names": names})
    assert (await agent.wait(tid))["state"] == "succeeded"
    res = await agent.call("get_task_result", task_id=tid)
    assert sorted(a["name"] for a in res["artifacts"]) == ["nested/dir/ok2.txt", "ok.txt"]
    warnings = [ln["message"] for ln in await agent.all_logs(tid) if ln["level"] == "warning"]
    assert len(warnings) == 3 and all("skipped" in w for w in warnings)  # .hidden, dir/.secret, bad\x01name
    # ../escaped.txt landed outside the artifacts directory: the runner never saw it as one
    assert not any("escaped" in a["name"] for a in res["artifacts"])
    links = [a["download_url"] for a in res["artifacts"]]
    async with httpx.AsyncClient() as http:
        assert [(await http.get(u)).status_code for u in links] == [200, 200]


async def test_forged_artifact_reports_are_not_registered(agent: Agent, cp) -> None:
    victim = await agent.submit(inputs={"artifact_bytes": 10})
    assert (await agent.wait(victim))["state"] == "succeeded"
    tid = await agent.submit(inputs={"sleep_s": 30})
    await agent.wait(tid, {"running"})
    job = cp.store.jobs.get(AttemptRef(tid, 1))
    good = {"name": "fine.bin", "key": f"tasks/{tid}/attempts/1/artifacts/fine.bin", "size_bytes": 1,
            "sha256": "0" * 64}
    forged = [
        {**good, "name": "../../x", "key": f"tasks/{tid}/attempts/1/artifacts/../../x"},
        {**good, "name": "/etc/passwd", "key": "/etc/passwd"},
        {**good, "name": "stolen.bin", "key": f"tasks/{victim}/attempts/1/artifacts/data.bin"},
        {**good, "name": "ctl\x07.bin", "key": f"tasks/{tid}/attempts/1/artifacts/ctl\x07.bin"},
        {**good, "sha256": "not-a-hash"},
        {**good, "name": "nul.bin", "key": f"tasks/{tid}/attempts/1/artifacts/nul.bin", "sha256": "\x00" * 64},
        {**good, "name": "huge.bin", "key": f"tasks/{tid}/attempts/1/artifacts/huge.bin", "size_bytes": 2**70},
    ]
    # labels no column can keep (too long for kind's 64 characters, a NUL in the content type):
    # the artifact is registered with the default labels, on every engine alike
    odd = {**good, "name": "odd.bin", "key": f"tasks/{tid}/attempts/1/artifacts/odd.bin", "kind": "k" * 65,
           "content_type": "text/\x00plain"}
    event = {"seq": job.event_seq + 1, "type": "finished", "status": "succeeded", "exit_code": 0,
             "result": {}, "artifacts": forged + [good, odd]}
    url = f"{cp.public_url}/runner/v1/tasks/{tid}/attempts/1/events"
    secret = runner_secret(cp.secret_key, AttemptRef(tid, 1))
    async with httpx.AsyncClient() as http:
        r = await http.post(url, json={"events": [event]}, headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200, r.text
    assert [(a.name, a.kind, a.content_type) for a in cp.store.artifacts.of(tid)] == [
        ("fine.bin", "file", "application/octet-stream"), ("odd.bin", "file", "application/octet-stream")]
    assert cp.store.tasks.get(tid).state == "succeeded"
    assert [a.name for a in cp.store.artifacts.of(victim)] == ["data.bin"]  # untouched


async def test_a_runner_secret_is_good_for_its_own_task_and_attempt_only(agent: Agent, cp) -> None:
    tid = await agent.submit(inputs={"sleep_s": 30})
    await agent.wait(tid, {"running"})
    url = f"{cp.public_url}/runner/v1/tasks/{tid}/attempts/1/events"
    async with httpx.AsyncClient() as http:
        for secret in (runner_secret(cp.secret_key, AttemptRef(tid, 2)), runner_secret(cp.secret_key, AttemptRef("tsk_other", 1)), "x"):
            r = await http.post(url, json={"events": []}, headers={"Authorization": f"Bearer {secret}"})
            assert r.status_code == 401
        assert (await http.post(url, json={"events": []})).status_code == 401  # no credentials at all
        good = runner_secret(cp.secret_key, AttemptRef(tid, 1))
        r = await http.post(url, json={"events": []}, headers={"Authorization": f"Bearer {good}"})
        assert r.status_code == 200  # the right one is accepted (a heartbeat)
    await agent.call("cancel_task", task_id=tid)
