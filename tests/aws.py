"""AWS Batch offline: moto's server (Batch, CloudWatch Logs, S3, IAM) and an executor that plays
Batch's compute environment.

moto without Docker marks a submitted job SUCCEEDED at once and runs nothing. `BatchExecutor`
makes jobs live instead: moto keeps every submitted job SUBMITTED (its "finish at submit" step
is replaced; moto is the emulator, the SDK is untouched), and the executor moves them through
RUNNABLE, STARTING and RUNNING, runs each job's container overrides (its command and
environment) with the real in-job runner as a local process, forwards the runner's output to
the job's CloudWatch log stream as Batch's awslogs driver does, and ends the job SUCCEEDED or
FAILED with the runner's exit code. TerminateJob (which moto only records) stops the process
(SIGTERM, like ECS stopping a container) or fails a job that has not started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.cloud import AWS_ENV, ROOT, exercise_catalog

QUEUE = "cp-queue"
JOB_DEFINITION = "controlplane-runner"
LOG_GROUP = "/aws/batch/job"
ACCOUNT = "123456789012"
REGION = "us-east-1"


def aws_env(moto_url: str) -> dict[str, str]:
    return {**AWS_ENV, "AWS_ENDPOINT_URL": moto_url}


def client(service: str, moto_url: str) -> Any:
    return boto3.client(service, endpoint_url=moto_url, region_name=REGION, aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"])


def reset_moto(moto_url: str) -> None:
    for path, body in (("/moto-api/reset", b""), ("/moto-api/config", json.dumps({"batch": {"use_docker": False}}).encode())):
        urllib.request.urlopen(urllib.request.Request(moto_url + path, data=body, method="POST")).read()


def create_batch(moto_url: str) -> None:
    """A compute environment, a job queue, the runner's job definition and the log group."""
    role = client("iam", moto_url).create_role(RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    batch = client("batch", moto_url)
    ce = batch.create_compute_environment(computeEnvironmentName="cp-ce", type="UNMANAGED", serviceRole=role)
    batch.create_job_queue(jobQueueName=QUEUE, state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}])
    batch.register_job_definition(jobDefinitionName=JOB_DEFINITION, type="container", containerProperties={
        "image": "controlplane-runner:latest",
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}]})
    client("logs", moto_url).create_log_group(logGroupName=LOG_GROUP)


def register_fargate_definition(moto_url: str, name: str, storage_gib: int | None = None) -> str:
    """A Fargate job definition for the runner, with `storage_gib` of ephemeral storage (None:
    Fargate's default); its ARN."""
    props: dict[str, Any] = {"image": "controlplane-runner:latest",
                             "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "2048"}],
                             "executionRoleArn": f"arn:aws:iam::{ACCOUNT}:role/batch",
                             "networkConfiguration": {"assignPublicIp": "ENABLED"}}
    if storage_gib is not None:
        props["ephemeralStorage"] = {"sizeInGiB": storage_gib}
    return client("batch", moto_url).register_job_definition(
        jobDefinitionName=name, type="container", platformCapabilities=["FARGATE"],
        containerProperties=props)["jobDefinitionArn"]


@pytest.fixture
def moto(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """moto's server as a Batch account: reset, jobs kept SUBMITTED for the executor, a queue and a
    job definition, its endpoint and credentials in the environment, the provider polling fast."""
    reset_moto(moto_server)
    keep_submitted(monkeypatch)
    create_batch(moto_server)
    for k, v in aws_env(moto_server).items():
        monkeypatch.setenv(k, v)
    # The provider's own settings (CONTROLPLANE_AWS_BATCH_*), fast for tests.
    monkeypatch.setenv("CONTROLPLANE_AWS_BATCH_POLL_INTERVAL_S", "0.2")
    monkeypatch.setenv("CONTROLPLANE_AWS_BATCH_MAX_TPS", "500")
    return moto_server


def backend() -> Any:
    from moto.batch.models import batch_backends

    return batch_backends[ACCOUNT][REGION]


def keep_submitted(monkeypatch: Any = None) -> None:
    """moto (without Docker) ends a job at submit; keep it SUBMITTED for the executor instead.
    With a pytest monkeypatch the change is undone after the test."""
    from moto.batch_simple.models import BatchSimpleBackend

    def register_only(self: Any, include_start_attempt: bool, job: Any) -> None:
        self.backend._jobs[job.job_id] = job
        job.status = "SUBMITTED"

    if monkeypatch is not None:
        monkeypatch.setattr(BatchSimpleBackend, "_mark_job_as_finished", register_only)
    else:
        BatchSimpleBackend._mark_job_as_finished = register_only  # type: ignore[method-assign]



def hook_submits(monkeypatch: Any, hook: Callable[[str], None]) -> None:
    """Call `hook` in each SubmitJob's own thread on moto's server: "received" before moto makes
    the job, "created" after (before the answer). A hook that waits holds that call alone."""
    from moto.batch_simple.models import BatchSimpleBackend

    submit = BatchSimpleBackend.submit_job

    def hooked(self: Any, *args: Any, **kw: Any) -> Any:
        hook("received")
        out = submit(self, *args, **kw)
        hook("created")
        return out

    monkeypatch.setattr(BatchSimpleBackend, "submit_job", hooked)


class BatchExecutor:
    def __init__(self, moto_url: str, *, start_jobs: bool = True,
                 job_env: Callable[[dict[str, str]], dict[str, str]] | None = None):
        self.moto_url = moto_url
        self.start_jobs = start_jobs  # False: jobs wait in RUNNABLE (no capacity)
        self.job_env = job_env  # what a job's container environment becomes (e.g. no credentials)
        self.envs: dict[str, dict[str, str]] = {}  # job name -> the environment its runner got
        self.logs = client("logs", moto_url)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.seen: set[str] = set()
        self.runs: dict[str, int] = {}  # job name -> times it was started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batch-executor", daemon=True)

    def __enter__(self) -> BatchExecutor:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for job in list(backend()._jobs.values()):
                try:
                    self._step(job)
                except Exception as e:  # noqa: BLE001 - keep playing Batch for the other jobs
                    print(f"batch executor: {job.job_id}: {e!r}", file=sys.stderr)
            time.sleep(0.02)

    def _step(self, job: Any) -> None:
        jid = job.job_id
        if jid not in self.seen:
            self.seen.add(jid)
            job.status = "RUNNABLE"
        if job.job_stopped:
            return
        proc = self.procs.get(jid)
        if job.stop and proc is None:  # terminated before it started
            self._finish(job, None)
            return
        if proc is None:
            if self.start_jobs and job.status == "RUNNABLE":
                self._start(job)
            return
        if job.stop and proc.poll() is None and not getattr(job, "_sigterm_sent", False):
            job._sigterm_sent = True
            os.killpg(proc.pid, signal.SIGTERM)
        if proc.poll() is not None:
            self._finish(job, proc.returncode)

    def _start(self, job: Any) -> None:
        job.status = "STARTING"
        overrides = job.container_overrides
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), "AWS_BATCH_JOB_ID": job.job_id}
        env.update({e["name"]: e["value"] for e in overrides.get("environment", [])})
        if self.job_env is not None:
            env = self.job_env(env)
        self.envs[job.job_name] = env
        command = [sys.executable if c == "python" else c for c in overrides.get("command", [])]
        job.job_started_at = datetime.now()
        job.log_stream_name = job._stream_name
        job._start_attempt()
        self.logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=job.log_stream_name)
        proc = subprocess.Popen([sys.executable, "-m", "controlplane_runner", "--job-name", job.job_name, "--", *command],
                                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[job.job_id] = proc
        self.runs[job.job_name] = self.runs.get(job.job_name, 0) + 1
        threading.Thread(target=self._forward_logs, args=(proc, job.log_stream_name), daemon=True).start()
        job.status = "RUNNING"

    def _forward_logs(self, proc: subprocess.Popen[bytes], stream: str) -> None:
        assert proc.stdout is not None
        batch: list[dict[str, Any]] = []
        for raw in iter(proc.stdout.readline, b""):
            batch.append({"timestamp": int(time.time() * 1000), "message": raw.decode(errors="replace").rstrip("\n")})
            if len(batch) >= 50:
                self.logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=batch)
                batch = []
        if batch:
            self.logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=batch)

    def _finish(self, job: Any, returncode: int | None) -> None:
        if returncode is not None:
            job.exit_code = returncode if returncode >= 0 else 128 - returncode
            if job.latest_attempt is not None:
                job.latest_attempt["container"]["exitCode"] = job.exit_code
        if not job.stop and returncode not in (None, 0):
            job.job_stopped_reason = "Essential container in task exited"
        job._mark_stopped(success=returncode == 0 and not job.stop)


def batch_catalog(home: Path, *, retry: str = "{ max_attempts = 1 }", provider_options: str = "",
                  job_definition: str = JOB_DEFINITION, resources: str = "") -> None:
    """The default catalog with `exercise` on AWS Batch (queue cp-queue) and a Batch resource class
    (`resources`: more of its TOML lines)."""
    options = f'job_queue = "{QUEUE}", job_definition = "{job_definition}"' + (f", {provider_options}" if provider_options else "")
    exercise_catalog(home, provider="aws_batch", resource_class="batch", retry=retry, options=options,
                     resources="max_concurrency = 4\nmax_queue_length = 100\ncpu = 2\nmemory_mb = 2048" + resources)
