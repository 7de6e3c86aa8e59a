"""A leader paused past its lease, on every provider: two control-plane replicas (subprocesses) on
one PostgreSQL database launch eight tasks on the local provider, AWS Batch (moto's server and its
executor), Cloud Run (FakeCloudRun) or Container Apps (FakeAzure); the leader is stopped with
SIGSTOP in the middle of its launches, the other replica takes over, and the first is resumed.

The stop lands either at a random moment of the launches or inside the provider's launch call,
held by the fake until the successor has launched (or found) every job: held before the fake
makes the execution, the successor finds nothing and launches again, so every held call becomes
a second execution of its attempt; held before the answer, the successor must find the execution
the held call made.

Counted from what the executions did (their consoles, as the provider's native log has them),
not from what the control plane believes: each attempt's tool ran once, and every other
execution of it ran nothing and said why; `controlplane jobs --json` counted the claims refused
to them. Each task succeeds once with its own result, also when the execution the control plane
recorded lost the claim to a late one (the job then follows the holder). The object store is one local directory shared by
both replicas and every job process (they all run on this host): the claim it holds is the same
code path on every store, and it spares each provider an emulator of its own.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from fastmcp import Client

from tests.cloud import exercise_catalog, moto_server  # noqa: F401  (fixture)
from tests.conftest import TERMINAL, Agent, ServerProcess, fast_env, reap_jobs, write_catalog
from tests.test_replicas import _launches_recorded, _leader_pid, pg_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.anyio
TASKS = 8
TOOL_OUTPUT = "line 0"  # what the exercise tool prints (log_lines=1) when it runs
REFUSED = re.compile(r"^# not started: .*already claimed by another execution.*\(exit 75\)")
LOCAL_REFUSED = re.compile(r"^# not started: \S+ already has its runner")  # the local job directory's own claim


@dataclass(frozen=True)
class Execution:
    """One execution of an attempt as the cloud saw it."""

    marker: str  # the attempt's job name (CONTROLPLANE_JOB_NAME)
    ended: bool
    exit_code: int | None
    console: tuple[str, ...]
    name: str = ""  # the provider's id of the execution (Batch job id, execution name)


@dataclass
class Gate:
    """A launch hook that holds the replica's launch calls at one point (`at`) until opened."""

    at: str  # "received": before the fake makes the execution; "created": before it answers
    arrived: threading.Event = field(default_factory=threading.Event)
    opened: threading.Event = field(default_factory=threading.Event)
    holding: bool = True  # cleared once the paused leader's calls are in: its successor's pass
    held: int = 0

    def __call__(self, phase: str) -> None:
        if phase != self.at or not self.holding:
            return
        self.held += 1
        self.arrived.set()
        self.opened.wait(60)


@dataclass
class Cloud:
    name: str
    env: dict[str, str]  # the provider's CONTROLPLANE_* settings for the replicas
    catalog: Callable[[Path], None]
    executions: Callable[[], list[Execution]]
    gate: Callable[[Gate], None] | None = None  # install a launch hook on the fake


RESOURCES = "max_concurrency = 8\nmax_queue_length = 100\n"


def _local(tmp_path: Path) -> Iterator[Cloud]:
    def executions() -> list[Execution]:
        # Every execution of a job writes on the job's one console, and concurrent ones interleave:
        # an execution is a '# started' line (it took the job directory) or a refusal of that
        # directory; each refusal line, each run of the tool, and whatever is left are told apart.
        out = []
        for job_dir in sorted((tmp_path / "jobs").iterdir()):
            console = (job_dir / "console.log").read_text(errors="replace").splitlines()
            started = sum(1 for line in console if line.startswith("# started ") or LOCAL_REFUSED.match(line))
            refusals = [line for line in console if REFUSED.match(line) or LOCAL_REFUSED.match(line)]
            tools = [line for line in console if line == TOOL_OUTPUT]
            consoles = [(line,) for line in [*refusals, *tools]]
            consoles += [()] * (started - len(consoles))
            out += [Execution(job_dir.name, True, None, c) for c in consoles]
        return out

    yield Cloud("local", {}, lambda home: write_catalog(home, concurrency=TASKS), executions)


def _aws_batch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    from tests import aws

    url = request.getfixturevalue("moto_server")
    aws.reset_moto(url)
    aws.keep_submitted(monkeypatch)
    aws.create_batch(url)
    for k, v in aws.aws_env(url).items():
        monkeypatch.setenv(k, v)  # the replicas inherit them (fast_env keeps all but CONTROLPLANE_*)
    logs = aws.client("logs", url)

    def console(stream: str | None) -> tuple[str, ...]:
        if not stream:
            return ()
        events = logs.get_log_events(logGroupName=aws.LOG_GROUP, logStreamName=stream, startFromHead=True)["events"]
        return tuple(e["message"] for e in events)

    def executions() -> list[Execution]:
        return [Execution(j.job_name, bool(j.job_stopped), j.exit_code, console(j.log_stream_name), j.job_id)
                for j in list(aws.backend()._jobs.values())]

    def catalog(home: Path) -> None:
        exercise_catalog(home, provider="aws_batch", resource_class="batch", resources=RESOURCES + "cpu = 2\nmemory_mb = 2048",
                         options=f'job_queue = "{aws.QUEUE}", job_definition = "{aws.JOB_DEFINITION}"',
                         reachable_stores=("file://",))

    with aws.BatchExecutor(url):
        yield Cloud("aws_batch", {"CONTROLPLANE_AWS_BATCH_POLL_INTERVAL_S": "0.2", "CONTROLPLANE_AWS_BATCH_MAX_TPS": "500"},
                    catalog, executions, lambda gate: aws.hook_submits(monkeypatch, gate))


def _cloud_run() -> Iterator[Cloud]:
    from tests import gcp

    with gcp.FakeCloudRun() as fake:
        fake.create_job(gcp.PROJECT, gcp.REGION, gcp.JOB, command=gcp.RUNNER,
                        args=["python", "-m", "controlplane_tools.exercise"])
        env = {f"CONTROLPLANE_CLOUD_RUN_{k}": v for k, v in {
            "ENDPOINT": fake.url, "LOGGING_ENDPOINT": fake.url, "ANONYMOUS": "1", "POLL_INTERVAL_S": "0.2",
            "MAX_TPS": "500", "RETRY_DEADLINE_S": "20", "LIST_LAG_S": "1"}.items()}

        def executions() -> list[Execution]:
            return [Execution(e["env"].get("CONTROLPLANE_JOB_NAME", ""), e["state"] in ("succeeded", "failed", "cancelled"),
                              e["exit_code"], tuple(x["textPayload"] for x in fake.log_entries(e["name"])), e["name"])
                    for e in fake.executions()]

        def catalog(home: Path) -> None:
            exercise_catalog(home, provider="cloud_run", resource_class="cloudrun", resources=RESOURCES + "cpu = 1\nmemory_mb = 512",
                             options=f'project = "{gcp.PROJECT}", region = "{gcp.REGION}", job = "{gcp.JOB}"',
                             reachable_stores=("file://",))

        yield Cloud("cloud_run", env, catalog, executions, lambda gate: setattr(fake, "launch_hook", gate))


def _container_apps() -> Iterator[Cloud]:
    from tests import azure

    with azure.FakeAzure() as fake:
        fake.create_job(azure.RESOURCE_GROUP, azure.JOB, command=azure.RUNNER, image="cp-runner:1")
        env = {f"CONTROLPLANE_CONTAINER_APPS_{k}": v for k, v in {
            "SUBSCRIPTION_ID": azure.SUBSCRIPTION, "ENDPOINT": fake.url, "LOGS_ENDPOINT": fake.url,
            "WORKSPACE_ID": azure.WORKSPACE, "CA_BUNDLE": fake.ca_file, "ANONYMOUS": "1", "POLL_INTERVAL_S": "0.2",
            "MAX_READS_PER_S": "500", "MAX_WRITES_PER_S": "500", "LOG_SETTLE_S": "0", "RETRY_BACKOFF_S": "0.02"}.items()}

        def executions() -> list[Execution]:
            return [Execution(e["env"].get("CONTROLPLANE_JOB_NAME", ""), e["status"] in ("Succeeded", "Failed", "Stopped"),
                              e["exit_code"], tuple(r["Log_s"] for r in fake.log_rows(e["name"])), e["name"])
                    for e in fake.executions()]

        def catalog(home: Path) -> None:
            exercise_catalog(home, provider="container_apps", resource_class="aca", resources=RESOURCES + "cpu = 0.5\nmemory_mb = 1024",
                             options=f'resource_group = "{azure.RESOURCE_GROUP}", job = "{azure.JOB}"',
                             reachable_stores=("file://",))

        yield Cloud("container_apps", env, catalog, executions, lambda gate: setattr(fake, "launch_hook", gate))


@pytest.fixture
def cloud(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pg_url: str) -> Iterator[Cloud]:  # noqa: F811
    """The provider `request.param` names, with its fake serving (after `pg_url`: skipped first
    where PostgreSQL is absent)."""
    name = request.param
    if name == "local":
        yield from _local(tmp_path)
    elif name == "aws_batch":
        yield from _aws_batch(request, monkeypatch)
    elif name == "cloud_run":
        yield from _cloud_run()
    else:
        yield from _container_apps()


@pytest.mark.parametrize("cloud", ["local", "aws_batch", "cloud_run", "container_apps"], indirect=True)
async def test_a_leader_stopped_at_random_in_its_launches_runs_no_tool_twice(cloud: Cloud, pg_url: str,  # noqa: F811
                                                                             tmp_path: Path) -> None:
    await _paused_leader(cloud, pg_url, tmp_path, None)


# One hold point per cloud, to keep the file near three minutes (each case is 15-25 s); either
# point makes extra executions on every cloud (held calls, and the launches the woken leader had
# already decided on).
@pytest.mark.parametrize(("cloud", "at"), [("aws_batch", "created"), ("cloud_run", "received"),
                                           ("container_apps", "received")], indirect=["cloud"])
async def test_a_leader_stopped_inside_its_launch_call_runs_no_tool_twice(cloud: Cloud, at: str, pg_url: str,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    await _paused_leader(cloud, pg_url, tmp_path, Gate(at))


async def _paused_leader(cloud: Cloud, pg_url: str, tmp_path: Path, gate: Gate | None) -> None:  # noqa: F811
    """Submit TASKS tasks together through B; stop A (the leader) at random in its launches, or
    once the fake holds one of its launch calls (`gate`); resume A once B took over and every
    launch is recorded; then count what every execution did."""
    key = secrets.token_hex(32)
    homes = [tmp_path / "a", tmp_path / "b"]
    for h in homes:
        cloud.catalog(h)
    shared = dict(leader_lease_s=1.5, object_store_url=(tmp_path / "objects").as_uri(), local_jobs_dir=tmp_path / "jobs",
                  secret_key=key, keepalive_s=120)
    a, b = (ServerProcess(h, env={**fast_env(h, **shared), **cloud.env}) for h in homes)
    if gate is not None:
        assert cloud.gate is not None
        cloud.gate(gate)
    try:
        a.start()
        deadline = time.monotonic() + 10
        while _leader_pid(pg_url) != a.proc.pid:
            assert time.monotonic() < deadline, "replica A never took the leader lease"
            await anyio.sleep(0.05)
        b.start()
        async with Client(b.url) as cb:
            agent = Agent(cb)
            tids: dict[str, int] = {}

            async def submit(n: int) -> None:
                tids[await agent.submit(inputs={"sleep_s": 1, "log_lines": 1, "result": {"n": n}})] = n

            async with anyio.create_task_group() as tg:  # together: A claims them at once and launches them at once
                for n in range(TASKS):
                    tg.start_soon(submit, n)
            if gate is None:
                await anyio.sleep(random.uniform(0.0, 0.3))  # somewhere in A's launches
            else:
                assert await anyio.to_thread.run_sync(gate.arrived.wait, 20), "A's launch never reached the provider"
            os.kill(a.proc.pid, signal.SIGSTOP)
            try:
                if gate is not None:
                    await anyio.sleep(0.3)  # what A had sent before it stopped arrives, and is held too
                    gate.holding = False  # B's calls are not held
                deadline = time.monotonic() + 20
                while _leader_pid(pg_url) != b.proc.pid:
                    assert time.monotonic() < deadline, "replica B never took over"
                    await anyio.sleep(0.05)
                while _launches_recorded(pg_url, 0) < len(tids):  # B launches (or finds) what A left
                    assert time.monotonic() < deadline + 30, "replica B did not launch what A left"
                    await anyio.sleep(0.1)
            finally:
                if gate is not None:
                    gate.opened.set()  # the held calls go on: the fake makes their executions, or answers
                os.kill(a.proc.pid, signal.SIGCONT)
            final = {t: await agent.wait(t, TERMINAL, timeout=90) for t in tids}
            results = {t: (await agent.call("get_task_result", task_id=t)).get("result") for t in tids
                       if final[t]["state"] == "succeeded"}
        runs = await anyio.to_thread.run_sync(_every_execution_ended, cloud)
        counted = await anyio.to_thread.run_sync(_extra_claims_counted, b)
        story = {t: _story(pg_url, t, runs) for t, f in final.items() if f["state"] != "succeeded" or f["attempt"] != 1}
    finally:
        if gate is not None:
            gate.opened.set()
        for srv in (a, b):
            if srv.proc is not None and srv.proc.poll() is None:
                os.kill(srv.proc.pid, signal.SIGCONT)
            srv.stop()
        reap_jobs(tmp_path)

    markers = {f"cp-{t.removeprefix('tsk_')}-a1" for t in tids}
    assert {r.marker for r in runs} == markers, runs  # every execution is one of an attempt of these tasks
    extra = 0
    for marker in sorted(markers):
        mine = [r for r in runs if r.marker == marker]
        ran = [r for r in mine if TOOL_OUTPUT in r.console]
        assert len(ran) == 1, f"{marker}: the tool ran in {len(ran)} of its {len(mine)} executions: {mine}"
        for r in mine:
            if r is ran[0]:
                continue
            extra += 1
            said = [line for line in r.console if REFUSED.match(line) or LOCAL_REFUSED.match(line)]
            assert said, f"{marker}: an extra execution ran no tool but did not say why: {r}"
            assert r.exit_code in (None, 75), r
        refused = sum(1 for r in mine if any(REFUSED.match(line) for line in r.console))
        assert counted[marker] >= refused, f"{marker}: {refused} claims refused, {counted[marker]} counted ({mine})"
    where = "at random" if gate is None else f"inside a launch call (held at '{gate.at}', {gate.held} held)"
    print(f"\n{cloud.name}, leader stopped {where}: {len(runs)} executions of {len(markers)} attempts, "
          f"the tool ran once in each; {extra} extra executions ran nothing; refused claims counted "
          f"{sum(counted.values())}; {len(story)} tasks failed")
    assert not story, f"tasks that did not succeed once, at their first attempt: {story}"
    assert {t: r["n"] for t, r in results.items()} == tids  # each with its own result


def _every_execution_ended(cloud: Cloud, timeout: float = 60) -> list[Execution]:
    """The cloud's executions once each has ended and its console says whether its tool ran (the
    console is forwarded after the process exits)."""
    deadline = time.monotonic() + timeout
    while True:
        runs = cloud.executions()
        if all(r.ended and (TOOL_OUTPUT in r.console or any(line.startswith("# not started") for line in r.console))
               for r in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def _story(url: str, task_id: str, runs: list[Execution]) -> dict[str, Any]:
    """What a task that did not succeed went through: its events, its jobs row, its executions."""
    import psycopg

    with psycopg.connect(url) as db:
        events = db.execute("SELECT ts, kind, from_state, to_state, attempt, detail_json FROM task_events "
                            "WHERE task_id = %s ORDER BY pk", (task_id,)).fetchall()
        jobs = db.execute("SELECT job_name, state, handle_json, provider_status, provider_reason FROM jobs "
                          "WHERE task_id = %s", (task_id,)).fetchall()
    marker = f"cp-{task_id.removeprefix('tsk_')}-a1"
    return {"events": events, "jobs": jobs, "executions": [r for r in runs if r.marker == marker]}


def _extra_claims_counted(srv: ServerProcess) -> dict[str, int]:
    """Claims refused to extra executions, per job, as `controlplane jobs --json` shows them."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "controlplane.cli", "jobs", "--json", "--limit", "100"], env=srv.env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return {row["job_name"]: row["extra_claims"] for row in json.loads(out)}
