"""The choice of placement: the policy's order (the catalog's, or the cheapest at the price
table), a breaker per site that skips a placement after repeated failures and later probes it,
and `max_running` per placement. The cloud is Cloud Run's wire-level fake (`tests/gcp.py`) in
two regions, driven by the real client; the other placement is the real local provider. The
scheduler is ticked by hand, so that moves are counted in ticks, not timed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.breakers import Breakers
from controlplane.catalog import Catalog, CatalogError, Placed, default_catalog_text
from controlplane.placement import NO_CAPACITY, choose, order
from controlplane.settings import Settings
from controlplane.store.rows import JobRow
from controlplane_providers import ratelimit
from controlplane_providers.base import ProviderOptions
from tests import gcp
from tests.conftest import FAST, reap_jobs, serving

pytest.importorskip("google.cloud.run_v2")

EXERCISE = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]'
CENTRAL, EUROPE = "us-central1", "europe-west1"
SITE = f"cloud_run/{CENTRAL}"


def cloud_run(region: str, extra: str = "") -> str:
    """A Cloud Run placement on the fake; its jobs (local processes) reach the tests' file:// store."""
    return (f'{{ provider = "cloud_run", options = {{ project = "{gcp.PROJECT}", region = "{region}", '
            f'job = "{gcp.JOB}" }}, reachable_stores = ["file://"]{extra} }}')


def catalog_with(placements: str, policy: str = "ordered") -> str:
    """The default catalog with the exercise tool in a class of its own (ten slots) on `placements`."""
    text = default_catalog_text()
    assert EXERCISE in text
    text = text.replace(EXERCISE, f'placements = [{placements}]\nresource_class = "failover"\n'
                                  'command = ["{python}", "-m", "controlplane_tools.exercise"]')
    return text + f'\n[resource_classes.failover]\nmax_concurrency = 10\ncpu = 1\nmemory_mb = 512\n' \
                  f'placement_policy = "{policy}"\n'


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[gcp.FakeCloudRun]:
    with gcp.FakeCloudRun(start_jobs=False) as fake:  # executions stay pending: nothing runs there
        for region in (CENTRAL, EUROPE):
            fake.create_job(gcp.PROJECT, region, gcp.JOB, command=gcp.RUNNER)
        for k, v in {"ENDPOINT": fake.url, "LOGGING_ENDPOINT": fake.url, "ANONYMOUS": "1", "MAX_TPS": "500",
                     "RETRY_DEADLINE_S": "20", "LIST_LAG_S": "30"}.items():
            monkeypatch.setenv(f"CONTROLPLANE_CLOUD_RUN_{k}", v)
        ratelimit._registry.clear()
        yield fake


def run_calls(fake: gcp.FakeCloudRun, region: str = CENTRAL) -> int:
    """RunJob requests the fake received in `region` (refused or not)."""
    return sum(1 for _, method, path in fake.requests
               if method == "POST" and path.endswith(":run") and f"/locations/{region}/" in path)


def control_plane(home: Path, catalog: str, **settings: object) -> ControlPlane:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog)
    return ControlPlane(Settings(home=home, **{**FAST, **settings}))  # type: ignore[arg-type]


def submit(cp: ControlPlane) -> str:
    return cp.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 30}))["task_id"]


def where(cp: ControlPlane, tid: str) -> list[tuple[str, int, str | None]]:
    """Each attempt's job: (provider, placement, provider_status)."""
    return [(j.provider, j.placement, j.provider_status) for j in cp.store.jobs.of_task(tid)]


# ---- the decision ------------------------------------------------------------------------------------
PLACES = (Placed("cloud_run", ProviderOptions()), Placed("aws_batch", ProviderOptions()),
          Placed("container_apps", ProviderOptions()), Placed("local", ProviderOptions()))


def job(attempt: int, placement: int, status: str | None = None) -> JobRow:
    return JobRow(job_id=f"w{attempt}", task_id="t", attempt=attempt, provider=PLACES[placement].provider,
                  resource_class="c", job_name=f"j{attempt}", state="done", created_at=0.0,
                  provider_status=status, placement=placement)


@pytest.mark.parametrize(("policy", "costs", "previous", "blocked", "full", "chosen"), [
    ("ordered", (), [], set(), set(), 0),
    ("ordered", (), [], {0}, set(), 1),  # its breaker is open
    ("ordered", (), [], set(), {0, 1}, 2),  # no room at the first two
    ("ordered", (), [], {0, 2}, {1, 3}, None),  # none: the task stays queued
    ("ordered", (), [job(1, 1, NO_CAPACITY)], set(), set(), 2),  # away from the refusal, round the list
    ("ordered", (), [job(1, 3, NO_CAPACITY)], set(), set(), 0),
    ("ordered", (), [job(1, 1, NO_CAPACITY)], {2}, set(), 3),
    ("ordered", (), [job(1, 2)], set(), set(), 2),  # it ran there (and failed): it stays
    ("cheapest", (3.0, 1.0, 2.0, 0.5), [], set(), set(), 3),
    ("cheapest", (3.0, 1.0, 2.0, 0.5), [], {3}, set(), 1),
    ("cheapest", (3.0, 1.0, None, 1.0), [], {1}, set(), 3),  # ties in the catalog's order
    ("cheapest", (None, 1.0, 2.0, None), [], {1, 2}, set(), 0),  # no price known: last, in catalog order
    ("cheapest", (3.0, 1.0, 2.0, 0.5), [job(1, 3, NO_CAPACITY)], set(), set(), 1),  # the next cheapest
    ("cheapest", (3.0, 1.0, 2.0, 0.5), [job(1, 0, NO_CAPACITY)], set(), set(), 3),  # round the cost order
])
def test_the_policy_table(policy: str, costs: tuple[float | None, ...], previous: list[JobRow], blocked: set[int],
                          full: set[int], chosen: int | None) -> None:
    assert choose(PLACES, lambda: previous, policy=policy, costs=costs,  # type: ignore[arg-type]
                  blocked=blocked.__contains__, full=full.__contains__) == chosen


def test_one_placement_reads_nothing_but_its_room() -> None:
    def unread() -> list[JobRow]:
        raise AssertionError("one placement: the earlier attempts are not read")

    def no_breaker(_i: int) -> bool:
        raise AssertionError("one placement: its breaker is not asked")

    assert choose(PLACES[:1], unread, blocked=no_breaker) == 0
    assert choose(PLACES[:1], unread, blocked=no_breaker, full=lambda i: True) is None
    assert order(3, "cheapest", (None, 2.0, 1.0)) == [2, 1, 0] and order(3, "ordered", (None, 2.0, 1.0)) == [0, 1, 2]


def test_a_breaker_opens_after_failures_in_its_window_probes_once_and_backs_off() -> None:
    now = [0.0]
    b = Breakers(failures=3, window_s=10, cooldown_s=60, max_cooldown_s=150, clock=lambda: now[0])
    b.failed("x/r")
    now[0] = 11
    b.failed("x/r")
    b.failed("x/r")
    assert b.admits("x/r")  # the first fell out of the window
    b.failed("x/r")
    assert b.states() == {"x/r": "open"} and not b.admits("x/r")
    now[0] = 11 + 60
    assert b.admits("x/r") and b.states()["x/r"] == "half_open"
    b.chose("x/r")  # the probe
    assert not b.admits("x/r")  # one probe at a time
    b.failed("x/r")  # it failed: open twice as long
    now[0] += 119
    assert not b.admits("x/r")
    now[0] += 1
    b.chose("x/r")
    b.failed("x/r")  # 240, capped at 150
    now[0] += 150
    assert b.admits("x/r")
    b.chose("x/r")
    b.succeeded("x/r")
    assert b.states()["x/r"] == "closed" and b.admits("x/r")
    b.failed("y/r")
    b.provider_failed("x")  # a failed poll of x: each of its sites, y's not
    b.provider_failed("x")
    b.provider_failed("x")
    assert b.states() == {"x/r": "open", "y/r": "closed"}


# ---- the catalog ---------------------------------------------------------------------------------------
def test_placements_take_options_a_policy_and_max_running_and_errors_name_the_index() -> None:
    two = cloud_run(CENTRAL, ", max_running = 3") + ', { provider = "local" }'
    cat = Catalog.parse(catalog_with(two, "cheapest"))
    first, second = cat.placements("exercise")
    assert (first.provider, first.max_running, second.provider, second.max_running) == ("cloud_run", 3, "local", None)
    assert cat.resource_classes["failover"].placement_policy == "cheapest"
    assert cat.tools["exercise"].placement_policy is None  # its class's
    older = catalog_with('{ provider = "local", provider_options = {} }')
    assert Catalog.parse(older).placements("exercise") == (Placed("local", ProviderOptions()),)

    def problems(text: str) -> tuple[str, ...]:
        with pytest.raises(CatalogError) as e:
            Catalog.parse(text, source="c.toml")
        return e.value.problems

    assert problems(catalog_with('{ provider = "local" }, { provider = "local", max_running = 0 }')) == (
        "c.toml: tools.exercise.placements.1.max_running: Input should be greater than or equal to 1",)
    assert problems(catalog_with('{ provider = "local" }, { provider = "local", options = {}, provider_options = {} }')) \
        == ("c.toml: tools.exercise.placements.1: give options or provider_options, not both",)
    assert problems(catalog_with('{ provider = "local" }', "dearest")) == (
        "c.toml: resource_classes.failover.placement_policy: Input should be 'ordered' or 'cheapest'",)
    assert problems(catalog_with('{ provider = "local" }, ' + cloud_run(CENTRAL).replace(gcp.JOB, "")))[0].startswith(
        "c.toml: tools.exercise.placements.1.options.job")  # as the catalog wrote it


def validate_cli(path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """`controlplane catalog validate` of `text` written at `path`, as a user runs it."""
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "controlplane.cli", "catalog", "validate", str(path)],
                          capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "250", "PATH": os.environ["PATH"], "CONTROLPLANE_HOME": str(path.parent / "home"),
                               "PYTHONPATH": os.environ.get("PYTHONPATH", "")})


def test_validate_names_a_bad_option_under_the_key_the_catalog_wrote(tmp_path: Path) -> None:
    """`controlplane catalog validate` names a placement's bad field under `options` when the
    catalog wrote `options`, and under `provider_options` when it wrote that."""
    written = cloud_run(CENTRAL).replace(f'job = "{gcp.JOB}"', 'job = "j", jobb = "k"')
    path = tmp_path / "catalog.toml"

    def validate(text: str) -> subprocess.CompletedProcess[str]:
        return validate_cli(path, text)

    done = validate(catalog_with('{ provider = "local" }, ' + written))
    assert done.returncode == 1
    assert f"error: {path}: tools.exercise.placements.1.options.jobb: unknown field" in done.stderr
    assert "provider_options" not in done.stderr
    done = validate(catalog_with('{ provider = "local" }, ' + written.replace("options = {", "provider_options = {")))
    assert done.returncode == 1
    assert f"error: {path}: tools.exercise.placements.1.provider_options.jobb: unknown field" in done.stderr


@pytest.mark.parametrize("options", ['"us-central1"', '["us-central1"]'])
def test_validate_names_options_of_the_wrong_type_as_written_in_toml_and_yaml(tmp_path: Path, options: str) -> None:
    """A placement whose `options` is not a table is named `options` (what the catalog wrote,
    not the field it fills), in a TOML and in a YAML catalog alike."""
    import tomllib

    import yaml

    text = catalog_with(f'{{ provider = "local" }}, {{ provider = "cloud_run", options = {options} }}')
    as_yaml = yaml.safe_dump(tomllib.loads(text))
    for path, written in ((tmp_path / "catalog.toml", text), (tmp_path / "catalog.yaml", as_yaml)):
        done = validate_cli(path, written)
        assert done.returncode == 1, done.stderr
        assert f"error: {path}: tools.exercise.placements.1.options: Input should be a valid dictionary" in done.stderr
        assert "provider_options" not in done.stderr


# ---- on the wire ----------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_refusal_moves_within_a_tick_the_breaker_opens_then_probes(fake: gcp.FakeCloudRun, home: Path) -> None:
    cp = control_plane(home, catalog_with(cloud_run(CENTRAL) + ', { provider = "local" }'),
                       placement_breaker_failures=2, placement_breaker_cooldown_s=60)
    now = [1000.0]
    cp.breakers.clock = lambda: now[0]
    fake.quota_refusals = 100  # us-central1 has no room
    try:
        for n in (1, 2):  # two tasks refused there: each launched locally at the very next tick
            tid = submit(cp)
            ticks_before = cp.scheduler.ticks
            await cp.scheduler.tick()
            assert run_calls(fake) == n and where(cp, tid) == [("cloud_run", 0, NO_CAPACITY)]
            await cp.scheduler.tick()
            assert where(cp, tid)[1:] == [("local", 1, None)]
            assert cp.scheduler.ticks - ticks_before == 2  # refused at one tick, launched at the next
            task = cp.store.tasks.get(tid)
            assert task is not None and task.state == "scheduled" and task.attempt == 2 and task.failures == 0
        assert cp.breakers.states() == {SITE: "open", "local": "closed"}

        tid = submit(cp)  # open: the next task goes straight to the next placement, Cloud Run not called
        await cp.scheduler.tick()
        assert run_calls(fake) == 2 and where(cp, tid) == [("local", 1, None)]

        now[0] += 60  # cooled down: one task probes, the other of the same claim goes on
        probe, other = submit(cp), submit(cp)
        await cp.scheduler.tick()
        assert run_calls(fake) == 3 and where(cp, probe) == [("cloud_run", 0, NO_CAPACITY)]
        assert where(cp, other) == [("local", 1, None)]
        assert cp.breakers.states()[SITE] == "open"  # the probe was refused: open again, for 120 s
        now[0] += 119
        tid = submit(cp)
        await cp.scheduler.tick()
        assert run_calls(fake) == 3 and where(cp, tid) == [("local", 1, None)]

        now[0] += 1
        fake.quota_refusals = 0  # room again
        tid = submit(cp)
        await cp.scheduler.tick()
        assert run_calls(fake) == 4 and where(cp, tid) == [("cloud_run", 0, None)]
        assert cp.breakers.states()[SITE] == "closed"
        [execution] = fake.executions()
        assert cp.store.jobs.of_task(tid)[0].handle_json is not None and execution["name"]
    finally:
        reap_jobs(home)


@pytest.mark.anyio
async def test_max_running_per_placement_leaves_the_task_queued_when_none_has_room(fake: gcp.FakeCloudRun,
                                                                                 home: Path) -> None:
    placements = '{ provider = "local", max_running = 1 }, ' + cloud_run(CENTRAL, ", max_running = 1")
    cp = control_plane(home, catalog_with(placements))
    try:
        first, second, third = submit(cp), submit(cp), submit(cp)
        await cp.scheduler.tick()
        await cp.scheduler.tick()
        assert where(cp, first) == [("local", 0, None)] and where(cp, second) == [("cloud_run", 1, None)]
        assert where(cp, third) == [] and run_calls(fake) == 1  # no room anywhere: queued, nothing moved
        task = cp.store.tasks.get(third)
        assert task is not None and task.state == "queued" and task.attempt == 1 and task.failures == 0
    finally:
        reap_jobs(home)


@pytest.mark.anyio
async def test_a_tick_with_every_placement_full_or_open_writes_nothing(fake: gcp.FakeCloudRun, home: Path) -> None:
    """While a queued task's every placement is full (max_running) or skipped (its breaker open),
    the scheduler's ticks only read: no write transaction, no row locked. Room anywhere (the
    breaker closing) and the next tick claims the task there. (Statements counted on SQLite,
    by its trace callback.)"""
    placements = '{ provider = "local", max_running = 1 }, ' + cloud_run(CENTRAL)
    cp = control_plane(home, catalog_with(placements), placement_breaker_failures=1)
    try:
        first = submit(cp)
        await cp.scheduler.tick()
        assert where(cp, first) == [("local", 0, None)]
        cp.breakers.failed(SITE)  # Cloud Run in us-central1 skipped for a while
        second = submit(cp)
        await cp.scheduler.tick()  # the claim finds no room: the task stays queued
        assert where(cp, second) == []
        seen: list[str] = []
        if cp.db.is_sqlite:
            cp.db.engines.dispose()
            for engine in {cp.db.engines.engine, cp.db.engines.read_engine}:
                event.listen(engine, "connect", lambda conn, _r: conn.set_trace_callback(seen.append))
        for _ in range(3):
            await cp.scheduler.tick()
        assert where(cp, second) == [] and bool(seen) == cp.db.is_sqlite
        writes = [sql for sql in seen if sql.split()[0].upper() in ("INSERT", "UPDATE", "DELETE")
                  or sql.upper().startswith("BEGIN IMMEDIATE") or " FOR UPDATE" in sql.upper()]
        assert writes == []
        cp.breakers.succeeded(SITE)
        await cp.scheduler.tick()
        assert where(cp, second) == [("cloud_run", 1, None)] and run_calls(fake) == 1
    finally:
        reap_jobs(home)


@pytest.mark.sqlite_only("counts the statements SQLite runs (its trace callback)")
def test_a_shard_no_placement_takes_gives_its_sweeps_slot_back(home: Path) -> None:
    """A sweep's shard that `max_parallel` let through but no placement took (its only one at
    `max_running`) does not count against the sweep: the claim takes one shard, leaves the rest
    queued in its one pass over the queue, and reads the queue once."""
    cp = control_plane(home, catalog_with('{ provider = "local", max_running = 1 }'))
    cp.service.submit_sweep("local", api.SubmitSweep(tool_name="exercise", base_inputs={"sleep_s": 30},
                                                     vary=api.Vary.model_validate({"list": [{}] * 6}), max_parallel=3))
    seen: list[str] = []
    cp.db.engines.dispose()
    for engine in {cp.db.engines.engine, cp.db.engines.read_engine}:
        event.listen(engine, "connect", lambda conn, _r: conn.set_trace_callback(seen.append))
    claimed = cp.store.jobs.claim_for_launch("failover", 10, place=cp.scheduler.placer, lookahead=32)
    cp.db.dispose()
    assert len(claimed) == 1
    queue_reads = [sql for sql in seen if sql.lstrip().upper().startswith("SELECT") and "FROM TASKS" in sql.upper()
                   and "LIMIT" in sql.upper()]
    assert len(queue_reads) == 1, queue_reads


@pytest.mark.anyio
async def test_cheapest_picks_by_the_price_table(fake: gcp.FakeCloudRun, home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "prices.toml").write_text(
        f"[cloud_run.{CENTRAL}]\nvcpu_per_second = 0.001\nmemory_gib_per_second = 0.0001\n"
        f"[cloud_run.{EUROPE}]\nvcpu_per_second = 0.00001\nmemory_gib_per_second = 0.000001\n")
    cp = control_plane(home, catalog_with(cloud_run(CENTRAL) + ", " + cloud_run(EUROPE), "cheapest"))
    tid = submit(cp)
    await cp.scheduler.tick()
    assert where(cp, tid) == [("cloud_run", 1, None)]  # listed second, priced lower
    assert run_calls(fake, EUROPE) == 1 and run_calls(fake, CENTRAL) == 0

    ordered = control_plane(home, catalog_with(cloud_run(CENTRAL) + ", " + cloud_run(EUROPE), "ordered"))
    tid = submit(ordered)
    await ordered.scheduler.tick()
    assert where(ordered, tid) == [("cloud_run", 0, None)] and run_calls(fake, CENTRAL) == 1


@pytest.mark.anyio
async def test_the_breakers_are_on_metrics_and_the_dashboards_health_view(fake: gcp.FakeCloudRun, home: Path) -> None:
    cp = control_plane(home, catalog_with(cloud_run(CENTRAL) + ', { provider = "local" }'),
                       placement_breaker_failures=2)
    for _ in range(2):
        cp.breakers.failed(SITE)
    cp.breakers.succeeded("local")
    async with serving(cp) as server, httpx.AsyncClient(headers={"Accept": "text/html"}) as http:
        root = server.url.removesuffix("/mcp")
        samples = {(s.labels["site"], s.labels["state"]): s.value
                   for fam in text_string_to_metric_families((await http.get(f"{root}/metrics")).text)
                   if fam.name == "controlplane_placement_breaker" for s in fam.samples}
        assert samples[(SITE, "open")] == 1 and samples[(SITE, "closed")] == 0 and samples[("local", "closed")] == 1
        page = (await http.get(f"{root}/dashboard")).text
        assert f'<tr data-breaker="{SITE}"><td>{SITE}</td><td>open</td></tr>' in page


@pytest.mark.anyio
async def test_the_dashboard_counts_the_attempts_moved_off_each_placement(fake: gcp.FakeCloudRun, home: Path) -> None:
    """Two tasks refused for room in us-central1 and launched locally: the dashboard's overview
    counts two attempts moved off placement 0 and none off placement 1, from the jobs on file (so
    a restart or another replica shows the same)."""
    cp = control_plane(home, catalog_with(cloud_run(CENTRAL) + ', { provider = "local" }'))
    fake.quota_refusals = 100
    try:
        for _ in range(2):
            tid = submit(cp)
            await cp.scheduler.tick()
            await cp.scheduler.tick()
            assert where(cp, tid) == [("cloud_run", 0, NO_CAPACITY), ("local", 1, None)]
        again = ControlPlane(Settings(home=home, **FAST))  # what any replica reads
        async with serving(again) as server, httpx.AsyncClient(headers={"Accept": "text/html"}) as http:
            page = (await http.get(f"{server.url.removesuffix('/mcp')}/dashboard")).text
        assert '<tr data-moves="exercise/0"><td>exercise</td><td>0: cloud_run</td><td>2</td></tr>' in page
        assert 'data-moves="exercise/1"' not in page
    finally:
        reap_jobs(home)


@pytest.mark.sqlite_only("counts the statements SQLite runs (its trace callback)")
def test_the_choice_costs_a_claim_no_statement_unless_a_placement_has_max_running(home: Path) -> None:
    """Statements of one claim of one task: one placement as before (with or without the placer),
    five placements the same for a first attempt, and one count more per placement with a
    `max_running` the choice comes to."""

    def claim_statements(placements: str, placer: bool = True) -> list[str]:
        cp = control_plane(home / str(len(list(home.iterdir())) if home.exists() else 0), catalog_with(placements))
        submit(cp)
        seen: list[str] = []
        cp.db.engines.dispose()
        for engine in {cp.db.engines.engine, cp.db.engines.read_engine}:
            event.listen(engine, "connect", lambda conn, _r: conn.set_trace_callback(seen.append))
        claimed = cp.store.jobs.claim_for_launch("failover", 10, place=cp.scheduler.placer if placer else None)
        assert len(claimed) == 1
        cp.db.dispose()
        return [" ".join(sql.split()[:3]) for sql in seen]  # the statement's kind (its values differ)

    local = '{ provider = "local" }'
    before = claim_statements(local, placer=False)
    assert claim_statements(local) == before
    assert len(claim_statements(", ".join([local] * 5))) == len(before)
    capped = claim_statements('{ provider = "local", max_running = 1 }, ' + local)
    assert len(capped) == len(before) + 1 and sum("count(" in s.lower() for s in capped) == \
        sum("count(" in s.lower() for s in before) + 1
