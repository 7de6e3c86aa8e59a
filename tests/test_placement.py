"""Placement belongs to the attempt: a tool lists placements, each checked at load; the placement
an attempt runs on is chosen when it is claimed and kept on its job, and every read of the
attempt (status, logs, result, cost) and its release at expiry follow the job's. A placement
refusing a launch for capacity is waited for when it is the tool's only one, and left for the
next placement, without spending the retry budget, when there are others.

The refusing placement is `NoRoom`, a provider that never has room (its launches raise
`CapacityProviderError`, its options name a zone); the other is the real local provider, whose
jobs are real runner processes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from pydantic_settings import SettingsConfigDict
from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.catalog import Catalog, CatalogError, Placed, default_catalog_text
from controlplane.mcp.server import build_server
from controlplane.placement import NO_CAPACITY, choose
from controlplane.settings import Settings
from controlplane.store.rows import JobRow
from controlplane_providers import registry
from controlplane_providers.base import (
    CapacityProviderError,
    Handle,
    JobStatus,
    LaunchSpec,
    Provider,
    ProviderContext,
    ProviderOptions,
    ProviderSettings,
)
from tests.conftest import FAST, Agent

FULL = "noroom"
EXERCISE_PLACEMENT = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]'


class _Settings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_NOROOM_", extra="ignore")


class _Options(ProviderOptions):
    zone: str = "a"


@dataclass(frozen=True)
class Ticket(Handle):
    ticket: str


class NoRoom(Provider[Ticket]):
    """A runner that never has room: every launch is refused for capacity, and remembered."""

    name = FULL
    Settings = _Settings
    Options = _Options
    handle_type = Ticket

    def __init__(self, settings: _Settings, context: ProviderContext):
        self.refused: list[tuple[str, str]] = []  # (job name, zone)

    def launch(self, spec: LaunchSpec) -> Ticket:
        self.refused.append((spec.job_name, spec.options.zone))
        raise CapacityProviderError(f"zone {spec.options.zone} has no room")

    def find(self, spec: LaunchSpec) -> Ticket | None:
        return None

    def poll(self, handles: list[Ticket]) -> list[JobStatus]:
        return []

    def cancel(self, handle: Ticket, reason: str = "cancelled") -> None:
        pass


@pytest.fixture(autouse=True)
def noroom() -> Iterator[None]:
    registry.register(FULL, NoRoom)
    yield
    registry._classes.pop(FULL, None)


def catalog_with(placement: str) -> str:
    """The default catalog with the exercise tool placed by `placement` (TOML lines)."""
    text_ = default_catalog_text()
    assert EXERCISE_PLACEMENT in text_
    return text_.replace(EXERCISE_PLACEMENT, placement + '\nresource_class = "cpu_small"\n'
                         'command = ["{python}", "-m", "controlplane_tools.exercise"]')


TWO = 'placements = [{ provider = "noroom", provider_options = { zone = "b" } }, { provider = "local" }]'


def control_plane(home: Path, placement: str) -> ControlPlane:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_with(placement))
    return ControlPlane(Settings(home=home, **FAST))


async def wait_for(check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await anyio.sleep(0.05)


# ---- the catalog ----------------------------------------------------------------------------------
def test_a_tool_with_two_placements_loads_each_checked_by_its_provider() -> None:
    cat = Catalog.parse(catalog_with(TWO))
    assert cat.placements("exercise") == (Placed(FULL, _Options(zone="b")), Placed("local", ProviderOptions()))
    assert cat.tools["exercise"].provider == FULL  # its first placement's: what a submit is checked against
    assert cat.providers() == ["local", FULL]
    # provider = "..." with provider_options is a list of one
    assert cat.placements("lj_relax") == (Placed("local", ProviderOptions()),)

    bad = TWO.replace('{ provider = "local" }', '{ provider = "local", provider_options = { zone = "c" } }')
    with pytest.raises(CatalogError) as e:
        Catalog.parse(catalog_with(bad), source="cat.toml")
    assert e.value.problems == ("cat.toml: tools.exercise.placements.1.provider_options.zone: unknown field",)

    with pytest.raises(CatalogError) as e:
        Catalog.parse(catalog_with(TWO.replace('"noroom"', '"nowhere"')), source="cat.toml")
    assert e.value.problems[0].startswith("cat.toml: tools.exercise.placements.0.provider: unknown provider 'nowhere'")

    with pytest.raises(CatalogError) as e:
        Catalog.parse(catalog_with('provider = "local"\n' + TWO), source="cat.toml")
    assert e.value.problems == ("cat.toml: tools.exercise.placements: give either placements or provider "
                                "(with provider_options), not both",)


def test_the_next_placement_is_chosen_away_from_one_that_had_no_room() -> None:
    places = (Placed(FULL, _Options(zone="a")), Placed(FULL, _Options(zone="b")), Placed("local", ProviderOptions()))

    def job(attempt: int, placement: int, status: str | None = None) -> JobRow:
        return JobRow(job_id=f"w{attempt}", task_id="t", attempt=attempt, provider=places[placement].provider,
                      resource_class="cpu_small", job_name=f"j{attempt}", state="done", created_at=0.0,
                      provider_status=status, placement=placement)

    def unread() -> list[JobRow]:
        raise AssertionError("one placement: the earlier attempts are not read")

    assert choose(places[:1], unread) == 0
    assert choose(places, lambda: []) == 0
    assert choose(places, lambda: [job(1, 0, NO_CAPACITY)]) == 1
    assert choose(places, lambda: [job(1, 0, NO_CAPACITY), job(2, 1, NO_CAPACITY)]) == 2
    assert choose(places, lambda: [job(1, 2, NO_CAPACITY)]) == 0  # round again
    assert choose(places, lambda: [job(1, 0, NO_CAPACITY), job(2, 1)]) == 1  # it ran there: stays


def test_a_task_keeps_the_placements_it_was_admitted_under_across_a_reload() -> None:
    cat = Catalog.parse(catalog_with(TWO))
    before = time.time() - 1
    cat.adopt(Catalog.parse(catalog_with('provider = "local"')))
    assert cat.placements_at("exercise", before) == (Placed(FULL, _Options(zone="b")), Placed("local", ProviderOptions()))
    assert cat.placements_at("exercise", time.time()) == (Placed("local", ProviderOptions()),)
    assert cat.placements_at("nosuch", before) == ()


# ---- attempts ---------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_an_attempt_refused_for_room_runs_at_the_next_placement_and_every_read_follows_it(home: Path) -> None:
    cp = control_plane(home, TWO)
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 3, "result": {"answer": 7}})
        st = await agent.wait(tid)
        assert st["state"] == "succeeded", st
        assert st["attempt"] == 2 and st["error"] is None
        # what the agent reads: where it runs now, and where it was refused and why, in plain words
        assert (st["provider"], st["placement"]) == ("local", 1)
        [move] = st["moves"]
        assert (move["attempt"], move["provider"], move["placement"]) == (1, FULL, 0)
        assert move["reason"] == "the launch was refused for want of capacity or quota: zone b has no room"
        first, second = cp.store.jobs.of_task(tid)
        assert (first.provider, first.placement, first.provider_status) == (FULL, 0, NO_CAPACITY)
        assert (second.provider, second.placement) == ("local", 1) and second.handle_json
        assert cp.providers[FULL].refused == [(first.job_name, "b")]  # type: ignore[attr-defined]
        task = cp.store.tasks.get(tid)
        assert task is not None and task.failures == 0 and task.recoveries == 0  # no retry budget spent
        retries = [e.detail for e in cp.store.logs.events(tid) if e.kind == "retry"]
        assert [d["retry"] for d in retries] == ["elsewhere"] and "zone b has no room" in retries[0]["note"]

        # the job's own provider's log (the local console), not the task's first provider's
        console = await agent.provider_log_messages(tid, limit=50)
        assert "line 0" in console and "line 2" in console
        res = await agent.call("get_task_result", task_id=tid)
        assert res["result"]["answer"] == 7 and res["attempt"] == 2
        # priced where it ran (the local provider has a price; the refusing one none)
        assert res["estimated_cost"]["amount"] is not None and res["usage"]["run_seconds"] > 0
        with cp.db.read() as c:
            used = c.execute(text("SELECT attempt, provider FROM attempt_usage WHERE task_id = :t"), {"t": tid}).all()
        assert [tuple(r) for r in used] == [(2, "local")]

        # at expiry, the job that ran is released by its own provider: its directory goes
        job_dir = Path(json.loads(second.handle_json)["job_dir"])
        assert job_dir.is_dir()
        with cp.db.write() as c:
            c.execute(text("UPDATE tasks SET expires_at = :e WHERE task_id = :t"), {"e": time.time() - 60, "t": tid})
        assert cp.reconciler.retention.sweep(time.time()).expired == 1
        assert not job_dir.exists()


@pytest.mark.anyio
async def test_status_and_the_tool_resource_say_where_an_attempt_runs(home: Path) -> None:
    """get_task_status names the provider of the attempt's placement (after a move, the next
    one's), and tool:// lists every placement's provider in the catalog's order."""
    cp = control_plane(home, TWO)
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 1})
        st = await agent.wait(tid)
        assert st["state"] == "succeeded" and st["attempt"] == 2 and st["provider"] == "local", st
        doc = json.loads((await client.read_resource("tool://exercise"))[0].text)  # type: ignore[union-attr]
        assert doc["placements"] == [FULL, "local"] and doc["provider"] == FULL


@pytest.mark.anyio
async def test_a_tools_only_placement_without_room_is_waited_for_as_today(home: Path) -> None:
    cp = control_plane(home, 'provider = "noroom"')
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit()
        provider: NoRoom = cp.providers[FULL]  # type: ignore[assignment]
        await wait_for(lambda: len(provider.refused) >= 3)
        st = await agent.call("get_task_status", task_id=tid)
        assert st["state"] == "scheduled" and st["attempt"] == 1 and st["error"] is None
        [job] = cp.store.jobs.of_task(tid)
        assert {name for name, _zone in provider.refused} == {job.job_name}  # the same job, tried again
        assert job.provider_status is None
        await agent.call("cancel_task", task_id=tid)
        assert (await agent.wait(tid))["state"] == "cancelled"


@pytest.mark.anyio
async def test_when_every_placement_refuses_the_task_waits_before_it_comes_round_again(home: Path) -> None:
    both = 'placements = [{ provider = "noroom", provider_options = { zone = "a" } }, ' \
           '{ provider = "noroom", provider_options = { zone = "b" } }]'
    cp = control_plane(home, both)
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit()
        provider: NoRoom = cp.providers[FULL]  # type: ignore[assignment]
        await wait_for(lambda: len(provider.refused) >= 2)
        await anyio.sleep(1.0)  # the exercise tool's backoff_s is 10: a second round waits 5-10 s
        assert [zone for _name, zone in provider.refused] == ["a", "b"]
        task = cp.store.tasks.get(tid)
        assert task is not None and task.state == "queued" and task.attempt == 3
        assert task.not_before > time.time() + 2 and task.failures == 0 and task.recoveries == 0
        await agent.call("cancel_task", task_id=tid)
