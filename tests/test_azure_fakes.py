"""The Container Apps Jobs and Log Analytics fakes of tests/azure.py, driven only through the real
SDK clients (azure-mgmt-appcontainers' ContainerAppsAPIClient and azure-monitor-query's
LogsQueryClient, over HTTPS with the fake's CA), plus raw HTTP where a client cannot misbehave."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.appcontainers.models import EnvironmentVar, JobExecution, JobExecutionContainer, JobExecutionTemplate

from tests.azure import JOB, RESOURCE_GROUP, SUBSCRIPTION, WORKSPACE, FakeAzure, FakeCredential, arm_client, logs_client

RG = RESOURCE_GROUP
JOB_PATH = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RG}/providers/Microsoft.App/jobs/{JOB}"
PRINT_AND_EXIT = "import os, sys; print('hello', os.environ['GREETING']); print('bye'); sys.exit(int(os.environ.get('CODE', '0')))"
SLEEP = "import time; print('sleeping', flush=True); time.sleep(30)"
NAME = re.compile(rf"{JOB}-[a-z0-9]{{7}}")


@pytest.fixture
def fake() -> Iterator[FakeAzure]:
    with FakeAzure(seed=7) as f:
        f.create_job(RG, JOB, command=["python", "-c", "print('job default')"], env={"A": "1"})
        yield f


def template(code: str, env: dict[str, str] | None = None, **kw: Any) -> JobExecutionTemplate:
    return JobExecutionTemplate(containers=[JobExecutionContainer(
        image="runner:1", name="main", command=["python", "-c"], args=[code],
        env=[EnvironmentVar(name=k, value=v) for k, v in (env or {}).items()], **kw)])


def start(arm: Any, tmpl: JobExecutionTemplate | None = None) -> str:
    """The execution's name, from the first answer (never wait on the operation)."""
    return arm.jobs.begin_start(RG, JOB, template=tmpl, polling=False).result().name


def wait_for(get: Callable[[], JobExecution], done: Callable[[JobExecution], bool], timeout: float = 10) -> JobExecution:
    deadline = time.monotonic() + timeout
    while True:
        ex = get()
        if done(ex) or time.monotonic() > deadline:
            return ex
        time.sleep(0.02)


def status_in(*wanted: str) -> Callable[[JobExecution], bool]:
    return lambda ex: ex.properties.status in wanted


def cursor_query(execution: str, after: str | None = None, item: str = "", until: str = "2100-01-01T00:00:00.0000000Z",
                 take: int = 550) -> str:
    """The provider's log cursor: rows of one execution's replica after (time, _ItemId), oldest first,
    with the time as exact 7-digit text."""
    after_clause = (f"| where TimeGenerated > datetime({after}) or (TimeGenerated == datetime({after}) "
                    f"and strcmp(_ItemId, '{item}') > 0)\n") if after else ""
    return (f"ContainerAppConsoleLogs_CL\n"
            f"| where ContainerJobName_s == '{JOB}' and ContainerGroupName_s startswith '{execution}-'\n"
            f"{after_clause}"
            f"| where TimeGenerated <= datetime({until})\n"
            f"| order by TimeGenerated asc, _ItemId asc\n"
            f"| extend t = tostring(TimeGenerated)\n"
            f"| project t, _ItemId, Log_s, Stream_s\n"
            f"| take {take}")


def rows(logs: Any, query: str, timespan: Any = None) -> list[list[Any]]:
    result = logs.query_workspace(WORKSPACE, query, timespan=timespan)
    return [list(r) for r in result.tables[0].rows]


def test_start_runs_the_template_and_its_output_reaches_log_analytics(fake: FakeAzure) -> None:
    arm, logs = arm_client(fake), logs_client(fake)
    name = start(arm, template(PRINT_AND_EXIT, {"GREETING": "azure", "CONTROLPLANE_JOB_NAME": "t-1"},
                               resources={"cpu": 1.0, "memory": "2Gi"}))
    assert NAME.fullmatch(name)
    ex = wait_for(lambda: arm.job_execution(RG, JOB, name), status_in("Succeeded", "Failed"))
    assert ex.properties.status == "Succeeded" and ex.name == name and ex.id == f"{JOB_PATH}/executions/{name}"
    assert ex.properties.start_time <= ex.properties.end_time
    [c] = ex.properties.template.containers  # the template replaced the job's container
    assert (c.image, c.name, c.args, c.resources.cpu, c.resources.memory) == ("runner:1", "main", [PRINT_AND_EXIT], 1.0, "2Gi")
    assert {e.name: e.value for e in c.env} == {"GREETING": "azure", "CONTROLPLANE_JOB_NAME": "t-1"}
    assert fake.runs["t-1"] == 1 and fake.executions(JOB)[-1]["exit_code"] == 0

    found = rows(logs, cursor_query(name))
    assert [r[2] for r in found] == ["hello azure", "bye"] and {r[3] for r in found} == {"stdout"}
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z", r[0]) for r in found)
    assert [r[0] for r in found] == sorted(r[0] for r in found)

    # a non-zero exit fails the execution; without a template the job's own container runs
    failed = start(arm, template(PRINT_AND_EXIT, {"GREETING": "x", "CODE": "3"}))
    default = start(arm)
    assert wait_for(lambda: arm.job_execution(RG, JOB, failed), status_in("Succeeded", "Failed")).properties.status == "Failed"
    ex = wait_for(lambda: arm.job_execution(RG, JOB, default), status_in("Succeeded", "Failed"))
    assert ex.properties.status == "Succeeded" and {e.name: e.value for e in ex.properties.template.containers[0].env} == {"A": "1"}
    assert [r[2] for r in rows(logs, cursor_query(default))] == ["job default"]
    assert fake.executions(JOB)[-2]["exit_code"] == 3 and fake.api_versions and set(fake.api_versions) == {"2026-07-01"}


def test_processing_until_capacity_and_the_replica_timeout(fake: FakeAzure) -> None:
    arm = arm_client(fake)
    fake.start_jobs = False
    name = start(arm, template(SLEEP))
    time.sleep(0.1)
    ex = arm.job_execution(RG, JOB, name)
    assert ex.properties.status == "Processing" and ex.properties.start_time is None and fake.runs == {}
    fake.start_jobs = True
    assert wait_for(lambda: arm.job_execution(RG, JOB, name), status_in("Running")).properties.status == "Running"
    arm.jobs.begin_stop_execution(RG, JOB, name).result()

    fake.create_job(RG, JOB, command=["python", "-c", SLEEP], replica_timeout_s=0.3)
    name = start(arm)
    ex = wait_for(lambda: arm.job_execution(RG, JOB, name), status_in("Succeeded", "Failed", "Stopped"))
    assert ex.properties.status == "Failed" and fake.executions(JOB)[-1]["exit_code"] == 137

    # a container with no command runs its image's entrypoint: an image the fake does not know fails
    name = start(arm, JobExecutionTemplate(containers=[JobExecutionContainer(image="elsewhere:2", name="main")]))
    ex = wait_for(lambda: arm.job_execution(RG, JOB, name), status_in("Succeeded", "Failed"))
    assert ex.properties.status == "Failed" and fake.executions(JOB)[-1]["exit_code"] == 127
    assert [r["Stream_s"] for r in fake.log_rows(name)] == ["stderr"]


def test_stop_ends_the_process_and_ignore_stop_leaves_it_running(fake: FakeAzure) -> None:
    arm = arm_client(fake)
    name = start(arm, template(SLEEP))
    wait_for(lambda: arm.job_execution(RG, JOB, name), status_in("Running"))
    arm.jobs.begin_stop_execution(RG, JOB, name).result()  # polls the operation until the execution has ended
    ex = arm.job_execution(RG, JOB, name)
    assert ex.properties.status == "Stopped" and ex.properties.end_time is not None
    info = fake.executions(JOB)[-1]
    assert info["stop_requested"] and info["exit_code"] == 128 + 15  # SIGTERM
    arm.jobs.begin_stop_execution(RG, JOB, name).result()  # stopping an ended execution: 200, no error

    fake.ignore_stop = True
    name = start(arm, template(SLEEP))
    wait_for(lambda: arm.job_execution(RG, JOB, name), status_in("Running"))
    arm.jobs.begin_stop_execution(RG, JOB, name, polling=False).result()
    time.sleep(0.2)
    assert arm.job_execution(RG, JOB, name).properties.status == "Running"
    fake.ignore_stop = False
    arm.jobs.begin_stop_execution(RG, JOB, name).result()
    assert arm.job_execution(RG, JOB, name).properties.status == "Stopped"

    # synthetic executions end at once; forced states show as the API's status
    a, b = fake.add_executions(RG, JOB, 2)
    arm.jobs.begin_stop_execution(RG, JOB, a).result()
    assert arm.job_execution(RG, JOB, a).properties.status == "Stopped"
    fake.set_status(b, "Degraded")
    assert arm.job_execution(RG, JOB, b).properties.status == "Degraded"
    fake.set_status(b, "Unknown")
    assert arm.job_execution(RG, JOB, b).properties.status == "Unknown"
    fake.finish(b, exit_code=1)
    fake.set_status(b, None)
    assert arm.job_execution(RG, JOB, b).properties.status == "Failed"


def test_list_pages_across_next_link_newest_first_and_filters_on_status(fake: FakeAzure) -> None:
    arm = arm_client(fake)
    fake.page_size = 3
    processing = fake.add_executions(RG, JOB, 2, status="Processing")
    running = fake.add_executions(RG, JOB, 7)
    fake.reset_counts()
    listed = [ex.name for ex in arm.jobs_executions.list(RG, JOB)]
    assert listed == list(reversed(processing + running))
    pages = [p for _, m, p in fake.requests if m == "GET"]
    assert pages == [f"{JOB_PATH}/executions"] * 3  # 9 executions, 3 a page: three calls across nextLink

    fake.finish(running[0])
    only_running = [ex.name for ex in arm.jobs_executions.list(RG, JOB, filter="properties/status eq 'Running'")]
    assert only_running == list(reversed(running[1:]))
    either = arm.jobs_executions.list(RG, JOB, filter="properties/status eq 'Running' or properties/status eq 'Processing'")
    assert len(list(either)) == 8
    with pytest.raises(HttpResponseError) as bad:
        list(arm.jobs_executions.list(RG, JOB, filter="properties/startTime gt 2026-01-01"))
    assert bad.value.status_code == 400 and bad.value.error.code == "BadRequest"

    fake.history_limit = 0  # the real service keeps a limited history: ended executions vanish
    fake.finish(running[1])
    assert running[0] not in {ex.name for ex in arm.jobs_executions.list(RG, JOB)}


def test_not_found_and_forget(fake: FakeAzure) -> None:
    arm = arm_client(fake)
    assert arm.jobs.get(RG, JOB).name == JOB
    with pytest.raises(ResourceNotFoundError) as err:
        arm.job_execution(RG, JOB, f"{JOB}-nothere")
    assert err.value.error.code == "ResourceNotFound"
    with pytest.raises(ResourceNotFoundError):
        arm.jobs.get(RG, "no-such-job")
    with pytest.raises(ResourceNotFoundError):
        arm.jobs.begin_start(RG, "no-such-job", polling=False)
    with pytest.raises(ResourceNotFoundError):
        list(arm.jobs_executions.list(RG, "no-such-job"))
    name = start(arm, template(SLEEP))
    wait_for(lambda: arm.job_execution(RG, JOB, name), status_in("Running"))
    fake.forget(name)
    with pytest.raises(ResourceNotFoundError):
        arm.job_execution(RG, JOB, name)
    with pytest.raises(ResourceNotFoundError):
        arm.jobs.begin_stop_execution(RG, JOB, name, polling=False)


def test_requests_without_a_bearer_token_are_refused(fake: FakeAzure) -> None:
    credential = FakeCredential()
    arm_client(fake, credential).jobs.get(RG, JOB)
    assert fake.tokens == ["fake-arm-token"] and credential.scopes == [("https://management.azure.com/.default",)]
    with httpx.Client(verify=fake.ca_file) as http:
        answer = http.get(f"{fake.url}{JOB_PATH}", params={"api-version": "2026-07-01"})
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "AuthenticationFailed"
        answer = http.post(f"{fake.url}/v1/workspaces/{WORKSPACE}/query", json={"query": "ContainerAppConsoleLogs_CL"})
        assert answer.status_code == 401
        ok = http.get(f"{fake.url}{JOB_PATH}", params={"api-version": "2026-07-01"}, headers={"Authorization": "Bearer x"})
        assert ok.status_code == 200 and ok.json()["name"] == JOB
        assert http.get(f"{fake.url}{JOB_PATH}", headers={"Authorization": "Bearer x"}).status_code == 400  # no api-version
    assert fake.tokens == ["fake-arm-token", "x", "x"]
    with pytest.raises(httpx.ConnectError):  # the certificate is the fake's own: not trusted by default
        httpx.get(f"{fake.url}{JOB_PATH}")


def test_throttling_429_retry_after_0_is_survived_by_the_sdk_retry(fake: FakeAzure) -> None:
    # azure-core retries any request answered with a Retry-After header (even a POST), but reads
    # `Retry-After: 0` as no header and falls back to exponential backoff (0.8 s x 2^n from the second
    # retry on) with 3 status retries: the client here has no backoff and more retries to stay fast.
    arm = arm_client(fake, retry_backoff_factor=0, retry_status=10)
    [name] = fake.add_executions(RG, JOB, 1)
    fake.fault_rate = 0.5
    started = [start(arm) for _ in range(5)]
    for _ in range(20):
        assert arm.job_execution(RG, JOB, name).properties.status == "Running"
    assert len(list(arm.jobs_executions.list(RG, JOB))) == 6
    assert fake.faults > 10 and len(fake.executions(JOB)) == 6 and all(NAME.fullmatch(n) for n in started)
    fake.fault_rate = 0.0
    for n in started:
        arm.jobs.begin_stop_execution(RG, JOB, n).result()


def test_kql_cursor_query_and_its_limits(fake: FakeAzure) -> None:
    arm, logs = arm_client(fake), logs_client(fake)
    fake.start_jobs = False
    name = start(arm)
    t0, t1 = "2026-11-23T10:00:00.1234567Z", "2026-11-23T10:00:00.1234568Z"
    fake.add_log(RG, JOB, name, "second", ts=t0, item_id="bbbb")
    fake.add_log(RG, JOB, name, "first", ts=t0, item_id="aaaa")  # same instant: _ItemId breaks the tie
    fake.add_log(RG, JOB, name, "third", ts=t1, item_id="0000")
    fake.add_log(RG, JOB, name, "late", ts="2026-11-23T10:06:00Z", item_id="cccc")
    [other] = fake.add_executions(RG, JOB, 1)
    fake.add_log(RG, JOB, other, "not mine", ts=t0)
    until = "2026-11-23T10:05:00.0000000Z"

    page = rows(logs, cursor_query(name, until=until, take=2))
    assert page == [[t0, "aaaa", "first", "stdout"], [t0, "bbbb", "second", "stdout"]]
    rest = rows(logs, cursor_query(name, after=page[-1][0], item=page[-1][1], until=until))
    assert rest == [[t1, "0000", "third", "stdout"]]
    assert rows(logs, cursor_query(name, after=t1, item="0000", until=until)) == []

    # the timespan body field restricts TimeGenerated too (here it excludes the 10:06 row)
    window = (datetime(2026, 11, 23, 9, tzinfo=UTC), datetime(2026, 11, 23, 10, 1, tzinfo=UTC))
    assert [r[2] for r in rows(logs, cursor_query(name), timespan=window)] == ["first", "second", "third"]
    assert rows(logs, cursor_query(name), timespan=timedelta(hours=1)) == []  # all of these rows are older
    assert fake.queries[-1][1] == "PT3600.0S"

    # outside the subset, or wrong for Kusto itself: 400 BadArgumentError, never a wrong match
    for query in [
        "ContainerAppConsoleLogs_CL | summarize count()",
        "ContainerAppConsoleLogs_CL | where _ItemId > 'aaaa'",  # Kusto has no ordering of strings
        "ContainerAppConsoleLogs_CL | project Log_s | order by TimeGenerated asc",  # dropped by project
        "ContainerAppConsoleLogs_CL | where Log_s contains 'x'",
        "ContainerAppConsoleLogs | take 1",
        "ContainerAppConsoleLogs_CL | where TimeGenerated > '2026-11-23'",
    ]:
        with pytest.raises(HttpResponseError) as bad:
            logs.query_workspace(WORKSPACE, query, timespan=None)
        assert bad.value.status_code == 400 and "BadArgumentError" in str(bad.value), query

    fake.query_quota_per_min = 1  # a minute's quota, already spent above
    with pytest.raises(HttpResponseError) as throttled:
        logs.query_workspace(WORKSPACE, cursor_query(name), timespan=None)
    assert throttled.value.status_code == 429


def test_log_delay_hides_fresh_rows(fake: FakeAzure) -> None:
    arm, logs = arm_client(fake), logs_client(fake)
    fake.log_delay_s = 0.5
    name = start(arm, template(PRINT_AND_EXIT, {"GREETING": "later"}))
    deadline = time.monotonic() + 10
    while len(fake.log_rows(name)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    written = time.monotonic()
    assert [r["Log_s"] for r in fake.log_rows(name)] == ["hello later", "bye"]  # written...
    assert rows(logs, cursor_query(name)) == []  # ...but not yet visible to queries
    while not (found := rows(logs, cursor_query(name))) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [r[2] for r in found] == ["hello later", "bye"] and time.monotonic() - written > 0.3
