"""Jobs that hold no storage credential (`CONTROLPLANE_JOB_STORE_ACCESS=grants`), on the AWS
Batch harness: moto plays Batch and S3, and the real runner runs each job with every cloud
variable (AWS_*, AZURE_*, GOOGLE_*, ...) taken out of its environment. Inputs, events, result
and artifacts still arrive, through URLs the control plane signs for the attempt's own keys; with
the callback down, the events spilled and the result written through grants taken ahead still
end the task. The grants route refuses other attempts, other tasks and names outside the layout.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.launch import runner_secret
from controlplane.mcp.server import build_server
from controlplane.objectstore.base import attempt_prefix, events_prefix, result_key
from controlplane.settings import Settings
from tests import aws
from tests.aws import moto  # noqa: F401  (fixture)
from tests.cloud import moto_server  # noqa: F401  (fixture)
from tests.conftest import FAST, Agent

pytestmark = pytest.mark.anyio

CLOUD_VARS = ("AWS_", "AZURE_", "GOOGLE_", "STORAGE_EMULATOR_HOST", "CONTROLPLANE_GCS_")


class CallbackSwitch:
    """The runner API as the job reaches it: a forwarding proxy on 127.0.0.1 that the test can
    take down (connections refused), as a network partition between the job and the control plane."""

    def __init__(self) -> None:
        self.target = ""
        self.posts: list[tuple[str, bytes]] = []  # (path, body) of every call the job made, in order
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.posts.append((self.path, body))
                req = urllib.request.Request(outer.target.rstrip("/") + self.path.removeprefix("/runner/v1"),
                                             data=body, method="POST",
                                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, data = resp.status, resp.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/runner/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        self.up = True

    def down(self) -> None:
        if self.up:
            self.up = False
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Grants:
    cp: ControlPlane
    agent: Agent
    executor: aws.BatchExecutor
    switch: CallbackSwitch
    moto: str
    bucket: str


@pytest.fixture
async def grants(moto: str, home: Path) -> AsyncIterator[Grants]:
    name = f"cp-grants-{id(home) % 100000}"
    aws.client("s3", moto).create_bucket(Bucket=name)
    aws.batch_catalog(home)
    cp = ControlPlane(Settings(home=home, object_store_url=f"s3://{name}/runs", job_store_access="grants", **FAST))
    switch = CallbackSwitch()

    def job_env(env: dict[str, str]) -> dict[str, str]:
        switch.target = env["CONTROLPLANE_CALLBACK_URL"]
        clean = {k: v for k, v in env.items() if not k.startswith(CLOUD_VARS)}
        return {**clean, "CONTROLPLANE_CALLBACK_URL": switch.url}

    try:
        with aws.BatchExecutor(moto, job_env=job_env) as executor:
            async with Client(build_server(cp)) as client:
                yield Grants(cp, Agent(client), executor, switch, moto, name)
    finally:
        switch.down()


def job_name(tid: str, attempt: int = 1) -> str:
    return f"cp-{tid.removeprefix('tsk_')}-a{attempt}"


async def test_a_job_without_credentials_delivers_inputs_events_result_and_artifacts(grants: Grants) -> None:
    agent = grants.agent
    tid = await agent.submit(inputs={"progress_steps": 3, "sleep_s": 0.3, "log_lines": 25, "artifact_bytes": 50_000,
                                     "artifact_names": ["plots/a.txt"], "result": {"from": "grants"}})
    st = await agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded", st.get("error")
    env = grants.executor.envs[job_name(tid)]
    assert env["CONTROLPLANE_STORE_ACCESS"] == "grants"
    assert not [k for k in env if k.startswith(CLOUD_VARS)]  # no way to the bucket but the grants

    res = await agent.call("get_task_result", task_id=tid)
    assert res["result"]["from"] == "grants"  # the inputs were read: the tool echoes them back
    assert sorted(a["name"] for a in res["artifacts"]) == ["data.bin", "plots/a.txt"]
    big = next(a for a in res["artifacts"] if a["name"] == "data.bin")
    body = httpx.get(big["download_url"]).content
    assert len(body) == 50_000 and hashlib.sha256(body).hexdigest() == big["sha256"]
    assert [ln["message"] for ln in await agent.all_logs(tid)] == [f"line {i}" for i in range(25)]
    store = grants.cp.object_stores.default
    assert store.stat(result_key(AttemptRef(tid, 1))) is not None  # written by a signed PUT
    assert list(store.list(events_prefix(AttemptRef(tid, 1)))) == []  # the callback took every event


async def test_a_job_without_file_inputs_asks_for_no_input_files_grant(grants: Grants) -> None:
    """The launch tells the runner whether the task has file inputs; without any, it neither
    asks for `input_files.json` nor reads it."""
    tid = await grants.agent.submit(inputs={"result": {"ok": 1}})
    assert (await grants.agent.wait(tid, timeout=60))["state"] == "succeeded"
    assert "CONTROLPLANE_INPUT_FILES" not in grants.executor.envs[job_name(tid)]
    asked = [json.loads(body)["names"] for path, body in grants.switch.posts if path.endswith("/grants")]
    assert asked, "the job asks for grants"
    assert not [n for names in asked for n in names if n == "input_files.json" or n.startswith("inputs/")], asked


async def test_with_the_callback_down_spilled_events_and_the_result_still_end_the_task(grants: Grants) -> None:
    agent = grants.agent
    tid = await agent.submit(inputs={"progress_steps": 4, "sleep_s": 3, "result": {"late": True}})
    await agent.wait(tid, {"running"}, timeout=60)
    for _ in range(600):  # the tool runs (its first progress came through the callback): the inputs were read
        if (await agent.call("get_task_status", task_id=tid)).get("progress"):
            break
        await anyio.sleep(0.05)
    grants.switch.down()  # from now on the job reaches neither the callback nor the grants route
    st = await agent.wait(tid, timeout=60)
    assert st["state"] == "succeeded", st.get("error")
    assert st["progress"]["percent"] == 100  # progress reported while the callback was down
    res = await agent.call("get_task_result", task_id=tid)
    assert res["result"]["late"] is True
    spilled = list(grants.cp.object_stores.default.list(events_prefix(AttemptRef(tid, 1))))
    assert spilled and all(k.rsplit("/", 1)[1].startswith("spill-") for k in spilled)  # keys granted ahead


async def post(url: str, body: Any, secret: str) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient() as http:  # the control plane listens on this test's event loop
        r = await http.post(url, json=body, headers={"Authorization": f"Bearer {secret}"})
    return r.status_code, r.json()


async def test_the_grants_route_signs_only_the_attempts_own_keys(grants: Grants) -> None:
    agent = grants.agent
    tid = await agent.submit(inputs={"sleep_s": 30})
    other = await agent.submit(inputs={"sleep_s": 30})
    await agent.wait(tid, {"running"}, timeout=60)
    base = grants.cp.callback_url.rstrip("/")
    secret = runner_secret(grants.cp.secret_key, AttemptRef(tid, 1))
    url = f"{base}/tasks/{tid}/attempts/1/grants"

    status, body = (await post(url, {"names": ["inputs.json", "result.json", "events/x.jsonl", "artifacts/d/e.csv"]}, secret))
    assert status == 200, body
    prefix = f"/{grants.bucket}/runs/{attempt_prefix(AttemptRef(tid, 1))}"
    assert {n: (g["method"], urlsplit(g["url"]).path) for n, g in body["grants"].items()} == {
        "inputs.json": ("GET", prefix + "inputs.json"), "result.json": ("PUT", prefix + "result.json"),
        "events/x.jsonl": ("PUT", prefix + "events/x.jsonl"), "artifacts/d/e.csv": ("PUT", prefix + "artifacts/d/e.csv")}
    assert body["expires_in"] == grants.cp.settings.grant_url_ttl_s
    status, ahead = (await post(url, {"names": ["result.json"], "ahead": True}, secret))
    task = grants.cp.store.tasks.get(tid)
    assert task is not None and task.max_runtime_s == 300  # the tool's default runtime
    assert status == 200 and ahead["expires_in"] == 300 + grants.cp.settings.grant_run_margin_s  # its run + margin
    # the inputs grant reads the inputs; the result grant writes once
    async with httpx.AsyncClient() as http:
        assert (await http.get(body["grants"]["inputs.json"]["url"])).json() == {"sleep_s": 30}

    for bad in ["../x", "inputs.json/..", "artifacts/../../other/result.json", "artifacts/.hidden", "events/a/b",
                "events/", "logs/x", "/etc/passwd", "result.json\n", "", 7]:
        status, refused = (await post(url, {"names": [bad]}, secret))
        assert (status, refused["code"]) == (400, "INVALID_REQUEST"), bad
        assert "Traceback" not in refused["error"]
    for body in ({"names": "result.json"}, {"names": []}, {"names": ["result.json"], "ahead": "yes"}, ["result.json"]):
        status, refused = (await post(url, body, secret))
        assert (status, refused["code"]) == (400, "INVALID_REQUEST"), body
    # another task's keys: this attempt's secret does not open its route
    assert (await post(f"{base}/tasks/{other}/attempts/1/grants", {"names": ["result.json"]}, secret))[0] == 401
    # another attempt of this task: its own secret is refused while it is not current
    later = runner_secret(grants.cp.secret_key, AttemptRef(tid, 2))
    assert (await post(f"{base}/tasks/{tid}/attempts/2/grants", {"names": ["result.json"]}, later))[0] == 409
    await agent.call("cancel_task", task_id=tid)
    await agent.call("cancel_task", task_id=other)
    await agent.wait(tid, timeout=60)
    await agent.wait(other, timeout=60)
    assert (await post(url, {"names": ["result.json"]}, secret))[0] == 409  # an ended attempt is granted nothing


def test_grants_need_object_stores_that_sign_uploads(home: Path) -> None:
    """A local store cannot sign an upload, so a control plane told to run jobs on grants refuses
    to start with one rather than fail every job."""
    with pytest.raises(ValueError, match=r"needs object stores that sign uploads .*file:// does not"):
        ControlPlane(Settings(home=home, job_store_access="grants"))
