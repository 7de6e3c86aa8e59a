"""The Cloud Run and Cloud Logging fakes of tests/gcp.py, driven only through the real SDK clients
(google.cloud.run_v2 over REST, google.cloud.logging over its JSON API)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import run_v2

from tests.gcp import FakeCloudRun, logging_client, run_clients

P, R = "proj", "us-central1"
Cond = run_v2.Condition
EXIT_WITH_CODE = "print('hi'); print('there'); import sys, os; sys.exit(int(os.environ.get('CODE', '0')))"


@pytest.fixture
def fake() -> Iterator[FakeCloudRun]:
    with FakeCloudRun(seed=7) as f:
        yield f


def job(fake: FakeCloudRun, name: str = "cp-exercise", code: str = EXIT_WITH_CODE, **kw: Any) -> str:
    return fake.create_job(P, R, name, command=["python", "-c", code], env={"A": "1"}, **kw)


def wait_for(get: Callable[[], run_v2.Execution], done: Callable[[run_v2.Execution], bool], timeout: float = 10) -> run_v2.Execution:
    deadline = time.monotonic() + timeout
    while True:
        ex = get()
        if done(ex) or time.monotonic() > deadline:
            return ex
        time.sleep(0.02)


def completed(ex: run_v2.Execution) -> run_v2.Condition:
    return next(c for c in ex.conditions if c.type_ == "Completed")


def finished(ex: run_v2.Execution) -> bool:
    return completed(ex).state in (Cond.State.CONDITION_SUCCEEDED, Cond.State.CONDITION_FAILED)


def test_run_job_runs_a_process_to_success_and_failure(fake: FakeCloudRun) -> None:
    full = job(fake)
    jobs, execs = run_clients(fake.url)
    op = jobs.run_job(request={"name": full})
    name = op.metadata.name  # the Execution, without blocking on op.result()
    assert name.startswith(f"{full}/executions/cp-exercise-") and len(name.rsplit("-", 1)[1]) == 5
    assert completed(op.metadata).state in (Cond.State.CONDITION_PENDING, Cond.State.CONDITION_RECONCILING)
    ex = wait_for(lambda: execs.get_execution(name=name), finished)
    assert completed(ex).state == Cond.State.CONDITION_SUCCEEDED
    assert (ex.succeeded_count, ex.failed_count, ex.running_count, ex.job) == (1, 0, 0, "cp-exercise")
    assert ex.start_time and ex.completion_time and ex.log_uri.startswith("https://") and ex.log_uri.endswith(name.rsplit("/", 1)[1] + "%22")
    assert op.done() and op.result().name == name

    op = jobs.run_job(request={"name": full, "overrides": {
        "container_overrides": [{"env": [{"name": "CODE", "value": "3"}, {"name": "CONTROLPLANE_JOB_NAME", "value": "t-1"}]}],
        "timeout": {"seconds": 60}}})
    ex = wait_for(lambda: execs.get_execution(name=op.metadata.name), finished)
    cond = completed(ex)
    assert (cond.state, cond.execution_reason) == (Cond.State.CONDITION_FAILED, Cond.ExecutionReason.NON_ZERO_EXIT_CODE)
    assert "exit code 3" in cond.message and ex.failed_count == 1
    env = {e.name: e.value for e in ex.template.containers[0].env}
    assert env == {"A": "1", "CODE": "3", "CONTROLPLANE_JOB_NAME": "t-1"} and ex.template.timeout.seconds == 60
    assert fake.runs["t-1"] == 1 and fake.executions("cp-exercise")[-1]["exit_code"] == 3


def test_list_executions_pages_newest_first(fake: FakeCloudRun) -> None:
    fake.start_jobs = False
    full = job(fake)
    jobs, execs = run_clients(fake.url)
    names = [jobs.run_job(request={"name": full}).metadata.name for _ in range(5)]
    fake.reset_counts()
    pages = list(execs.list_executions(request={"parent": full, "page_size": 2}).pages)
    assert [len(p.executions) for p in pages] == [2, 2, 1]
    assert [e.name for p in pages for e in p.executions] == names[::-1]
    assert [m for _, m, path in fake.requests if path.endswith("/executions")] == ["GET"] * 3
    assert all(completed(e).state == Cond.State.CONDITION_PENDING for p in pages for e in p.executions)


def test_cancel_stops_the_process(fake: FakeCloudRun) -> None:
    full = job(fake, code="import time; print('sleeping', flush=True); time.sleep(60)")
    jobs, execs = run_clients(fake.url)
    name = jobs.run_job(request={"name": full}).metadata.name
    ex = wait_for(lambda: execs.get_execution(name=name), lambda e: e.running_count == 1)
    assert ex.running_count == 1
    op = execs.cancel_execution(name=name)
    assert op.metadata.name == name
    ex = wait_for(lambda: execs.get_execution(name=name), finished)
    cond = completed(ex)
    assert (cond.state, cond.execution_reason, ex.cancelled_count) == (Cond.State.CONDITION_FAILED, Cond.ExecutionReason.CANCELLED, 1)
    assert fake.processes[name].poll() is not None
    execs.cancel_execution(name=name)  # finished: answers, does not raise

    fake.start_jobs = False  # a pending execution is cancelled at once
    name = jobs.run_job(request={"name": full}).metadata.name
    assert execs.cancel_execution(name=name).metadata.cancelled_count == 1


def test_timeout_kills_the_process(fake: FakeCloudRun) -> None:
    full = job(fake, code="import time; time.sleep(60)")
    jobs, execs = run_clients(fake.url)
    name = jobs.run_job(request={"name": full, "overrides": {"timeout": {"seconds": 1}}}).metadata.name
    ex = wait_for(lambda: execs.get_execution(name=name), finished)
    assert completed(ex).state == Cond.State.CONDITION_FAILED and "timeout" in completed(ex).message


def test_not_found_forget_and_faults(fake: FakeCloudRun) -> None:
    fake.start_jobs = False
    full = job(fake)
    jobs, execs = run_clients(fake.url)
    with pytest.raises(exceptions.NotFound):
        jobs.run_job(request={"name": f"projects/{P}/locations/{R}/jobs/nope"})
    name = jobs.run_job(request={"name": full}).metadata.name
    fake.forget(name)
    with pytest.raises(exceptions.NotFound):
        execs.get_execution(name=name)
    assert list(execs.list_executions(parent=full)) == []

    synthetic = fake.add_executions(P, R, "cp-exercise", 3)
    fake.finish(synthetic[1], 2)
    states = {e.name: e for e in execs.list_executions(parent=full)}
    assert states[synthetic[0]].running_count == 1 and states[synthetic[1]].failed_count == 1
    assert {e.name: e.value for e in states[synthetic[2]].template.containers[0].env}["CONTROLPLANE_JOB_NAME"] == "synthetic-2"

    fake.fault_rate = 1.0
    with pytest.raises((exceptions.TooManyRequests, exceptions.ServiceUnavailable)):
        execs.get_execution(name=synthetic[0])
    with pytest.raises((exceptions.TooManyRequests, exceptions.ServiceUnavailable)):
        list(logging_client(fake.url, P).list_entries())
    assert fake.faults == 2


def test_logging_lists_the_process_lines(fake: FakeCloudRun) -> None:
    full = job(fake, code="for i in range(7): print(f'line {i}')")
    jobs, execs = run_clients(fake.url)
    name = jobs.run_job(request={"name": full}).metadata.name
    short = name.rsplit("/", 1)[1]
    wait_for(lambda: execs.get_execution(name=name), finished)
    fake.add_log(P, R, "other-job", "other-job-abcde", "not mine")
    since = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    flt = (f'resource.type = "cloud_run_job" AND resource.labels.job_name = "cp-exercise"\n'
           f'labels."run.googleapis.com/execution_name" = "{short}" timestamp >= "{since}"')
    client = logging_client(fake.url, P)
    fake.reset_counts()
    entries = list(client.list_entries(filter_=flt, page_size=3))
    assert [e.payload for e in entries] == [f"line {i}" for i in range(7)]
    assert len([r for r in fake.requests if r[2] == "/v2/entries:list"]) == 3  # 3 + 3 + 1
    assert entries[0].resource.type == "cloud_run_job" and entries[0].log_name.endswith("run.googleapis.com%2Fstdout")
    later = fake.log_entries(short)[3]["timestamp"]  # nanoseconds: the client's datetimes keep microseconds
    assert [e.payload for e in client.list_entries(filter_=f'{flt} AND timestamp > "{later}"')][0] == "line 4"
    assert [e.payload for e in client.list_entries(filter_=flt, order_by="timestamp desc")][0] == "line 6"
    assert [e.payload for e in client.list_entries(filter_='resource.labels.job_name="other-job"')] == ["not mine"]
    with pytest.raises(exceptions.BadRequest):
        list(client.list_entries(filter_=f'{flt} OR textPayload:"x"'))

    fake.log_delay_s = 30  # ingested, not yet listed
    fake.add_log(P, R, "cp-exercise", short, "late")
    assert [e.payload for e in client.list_entries(filter_=flt)][-1] == "line 6"
    assert fake.log_entries(short)[-1]["textPayload"] == "late"

    fake.logging_quota_per_min = 2
    list(client.list_entries(filter_=flt))
    list(client.list_entries(filter_=flt))
    with pytest.raises(exceptions.TooManyRequests):
        list(client.list_entries(filter_=flt))


def test_the_fakes_behave_as_the_services_at_the_edges(fake: FakeCloudRun) -> None:
    """Strict request fields, maxRetries reruns (3 when unset), a lagging list, an ambiguous
    RunJob, a reconciling end, an unfinished search, proto3 timestamps and OR in filters."""
    full = job(fake, name="by-hand", max_retries=None)
    jobs, execs = run_clients(fake.url)
    assert jobs.get_job(name=full).template.template.max_retries == 3
    op = jobs.run_job(request={"name": full, "overrides": {"container_overrides": [{"env": [{"name": "CODE", "value": "2"}]}]}})
    ex = wait_for(lambda: execs.get_execution(name=op.metadata.name), finished, timeout=20)
    assert ex.retried_count == 3 and ex.failed_count == 1 and fake.runs["by-hand"] == 4  # ran four times

    import requests
    r = requests.post(f"{fake.url}/v2/{full}:run", json={"name": full, "overrides": {"taskCount": 1, "maxRetries": 0}})
    assert r.status_code == 400 and 'Unknown name "maxRetries"' in r.json()["error"]["message"]
    r = requests.get(f"{fake.url}/v2/{full}/executions", params={"filter": "x"})
    assert r.status_code == 400 and "Cannot bind query parameter" in r.json()["error"]["message"]

    full = job(fake)
    fake.list_lag_s, fake.ambiguous_runs, fake.reconcile_s = 1.0, 1, 1.5
    with pytest.raises(exceptions.ServiceUnavailable):
        jobs.run_job(request={"name": full})
    [made] = fake.executions("cp-exercise")
    assert list(execs.list_executions(parent=full)) == [] and execs.get_execution(name=made["name"]).name
    ex = wait_for(lambda: execs.get_execution(name=made["name"]), lambda e: e.succeeded_count == 1)
    assert completed(ex).state == Cond.State.CONDITION_RECONCILING and ex.running_count == 0 and not ex.completion_time
    assert finished(wait_for(lambda: execs.get_execution(name=made["name"]), finished))
    assert [e.name for e in execs.list_executions(parent=full)] == [made["name"]]

    client = logging_client(fake.url, P)
    for ns in ("000000000", "120000000", "123456000", "123456789"):
        fake.add_log(P, R, "cp-exercise", made["short"], ns, ts=f"2030-01-01T00:00:00.{ns}Z")
    flt = f'labels."run.googleapis.com/execution_name" = "{made["short"]}" AND timestamp >= "2030-01-01T00:00:00Z"'
    wire = [e["timestamp"] for e in fake.log_entries(made["short"]) if e["timestamp"].startswith("2030")]
    assert wire == ["2030-01-01T00:00:00Z", "2030-01-01T00:00:00.120Z", "2030-01-01T00:00:00.123456Z",
                    "2030-01-01T00:00:00.123456789Z"]
    some = f'{flt} AND (textPayload = "120000000" OR NOT timestamp < "2030-01-01T00:00:00.123456789Z")'
    assert [e.payload for e in client.list_entries(filter_=some)] == ["120000000", "123456789"]
    fake.unfinished_searches = 1
    session = client._http
    answer = session.post(f"{fake.url}/v2/entries:list", json={"resourceNames": [f"projects/{P}"], "filter": flt}).json()
    assert "entries" not in answer and answer["nextPageToken"]
    with pytest.raises(exceptions.BadRequest):
        list(client.list_entries(filter_=flt, page_size=1001))
