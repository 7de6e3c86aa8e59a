"""Cost and usage: what each attempt used (its run time times its shape) and what that costs at
the price table's rates, in get_task_status and get_task_result; usage_report per tool, tag and
owner over a period, each caller seeing its own; the cost estimate at submit, learnt from the
tool's history; and budgets per caller or tag that refuse a submit that would exceed them,
creating nothing, also across two control planes on one database. All through real MCP clients.

The local provider costs nothing by default, so these tests price it in the home's prices.toml
(as an operator would): a vCPU-second costs 0.01 and a GiB-second 0.001."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.catalog import CatalogError
from controlplane.mcp.server import build_server
from controlplane.prices import PriceError, PriceTable, Usage
from controlplane.settings import Settings
from controlplane.store import queries as q
from tests.conftest import FAST, ROOT, Agent, ToolCallError, fast_env, record_statements, serving, write_catalog

pytestmark = pytest.mark.anyio

VCPU_S, GIB_S = 0.01, 0.001  # the prices below, per second
PRICES = "[local.default]\nvcpu_per_hour = 36.0\nmemory_gib_per_hour = 3.6\n"
# exercise's catalog estimate is 1 s on cpu_small (1 vCPU, 2048 MiB): what a first run should cost
FIRST_ESTIMATE = 1 * (1 * VCPU_S + 2 * GIB_S)


def priced(home: Path, prices: str = PRICES, **settings: Any) -> Settings:
    home.mkdir(parents=True, exist_ok=True)
    (home / "prices.toml").write_text(prices)
    return Settings(home=home, **{**FAST, **settings})


def cost_of(usage: dict[str, float]) -> float:
    return usage["vcpu_seconds"] * VCPU_S + usage["memory_gib_seconds"] * GIB_S


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args, "--home", str(home)], env=fast_env(home),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


# ---- usage and cost of a run -------------------------------------------------------------------
async def test_a_local_run_records_what_it_used_and_what_that_cost(home: Path) -> None:
    cp = ControlPlane(priced(home))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        t0 = time.time()
        sub = await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 2.0, "progress_steps": 4},
                               resources={"cpu": 0.5, "memory_mb": 1024})
        assert sub["estimated_cost"] == {"amount": pytest.approx(1 * (0.5 * VCPU_S + 1 * GIB_S)), "currency": "USD"}
        running = await agent.wait(sub["task_id"], {"running"})
        await anyio.sleep(0.5)
        so_far = await agent.call("get_task_status", task_id=sub["task_id"])
        st = await agent.wait(sub["task_id"])
        t1 = time.time()
        res = await agent.call("get_task_result", task_id=sub["task_id"])
    assert running["state"] == "running" and st["state"] == "succeeded", st
    # While it ran, what it had used so far; once it ended, what the attempt used in all.
    assert 0.4 <= so_far["usage"]["run_seconds"] < st["usage"]["run_seconds"]
    assert so_far["estimated_cost"]["amount"] == pytest.approx(cost_of(so_far["usage"]), abs=1e-5)
    used = st["usage"]
    assert 2.0 <= used["run_seconds"] <= t1 - t0  # it slept 2 s; it cannot have run longer than we waited
    assert used["vcpu_seconds"] == pytest.approx(0.5 * used["run_seconds"], abs=0.002)
    assert used["memory_gib_seconds"] == pytest.approx(1.0 * used["run_seconds"], abs=0.002)
    assert used["gpu_seconds"] == 0
    assert st["estimated_cost"] == {"amount": pytest.approx(cost_of(used), abs=1e-5), "currency": "USD",
                                    "at_submit": sub["estimated_cost"]["amount"]}
    assert res["usage"] == used and res["estimated_cost"] == st["estimated_cost"]


async def test_a_retried_task_used_what_each_of_its_attempts_used(home: Path) -> None:
    write_catalog(home, exercise_retry='{ max_attempts = 2, backoff_s = 0, retry_on = ["tool_failed"] }')
    cp = ControlPlane(priced(home))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"sleep_s": 1.0, "exit_code": 3})
        st = await agent.wait(tid)
        report = await agent.call("usage_report")
    assert st["state"] == "failed" and st["attempt"] == 2, st
    assert st["usage"]["run_seconds"] >= 2 * 1.0  # two runs of a second and more
    assert st["estimated_cost"]["amount"] == pytest.approx(cost_of(st["usage"]), abs=1e-5)
    [group] = report["groups"]
    assert (group["tool"], group["tasks"], group["attempts"]) == ("exercise", 1, 2)
    assert group["usage"] == st["usage"]


async def test_a_task_that_never_ran_used_nothing(home: Path) -> None:
    cp = ControlPlane(priced(home))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        busy = [await agent.submit(inputs={"sleep_s": 60}) for _ in range(2)]  # both slots of cpu_small
        tid = await agent.submit()
        await agent.call("cancel_task", task_id=tid)
        st = await agent.wait(tid)
        for b in busy:
            await agent.call("cancel_task", task_id=b)
    assert st["state"] == "cancelled"
    assert st["usage"] == {"run_seconds": 0, "vcpu_seconds": 0, "memory_gib_seconds": 0, "gpu_seconds": 0}
    assert st["estimated_cost"]["amount"] == 0 and st["estimated_cost"]["at_submit"] == pytest.approx(FIRST_ESTIMATE)


# ---- the price table ---------------------------------------------------------------------------
def test_the_price_table_is_dated_and_an_operator_overrides_it_rate_by_rate(tmp_path: Path) -> None:
    table = PriceTable.load()
    assert table.currency == "USD" and table.as_of == "2025-06-01"
    fargate = table.rate("aws_batch", "us-east-1")
    assert fargate.vcpu == pytest.approx(0.04048 / 3600) and fargate.memory_gib == pytest.approx(0.004445 / 3600)
    assert "Fargate" in fargate.source
    assert table.rate("aws_batch", "mars-north-1") == table.rate("aws_batch", None)  # the provider's default
    assert table.rate("cloud_run", "us-central1").vcpu == 0.000018  # listed per second, kept per second
    assert table.rate("local", None).vcpu == 0
    assert table.rate("elsewhere", None) is None
    # One vCPU and 2 GiB for an hour on Fargate in us-east-1, at list price:
    assert Usage.of_run(3600, 1, 2048, 0).cost(fargate) == pytest.approx(0.04048 + 2 * 0.004445)
    # A GPU-hour where no GPU rate is listed has no cost, rather than a wrong one.
    assert Usage.of_run(3600, 4, 16384, 1).cost(fargate) is None

    override = tmp_path / "prices.toml"
    override.write_text('[aws_batch.us-east-1]\ngpu_per_hour = 3.06\n\n[local.default]\nvcpu_per_second = 0.5\n')
    mine = PriceTable.load(override)
    rate = mine.rate("aws_batch", "us-east-1")
    assert rate.gpu == pytest.approx(3.06 / 3600) and rate.vcpu == fargate.vcpu  # the others stay
    assert Usage.of_run(3600, 4, 16384, 1).cost(rate) == pytest.approx(4 * 0.04048 + 16 * 0.004445 + 3.06)
    assert mine.rate("local", None).vcpu == 0.5 and mine.rate("local", None).memory_gib == 0

    override.write_text('currency = "EUR"\nas_of = "2026-11-01"\n[local.default]\nvcpu_per_hour = 1.0\n')
    euros = PriceTable.load(override)
    assert (euros.currency, euros.as_of) == ("EUR", "2026-11-01")
    assert euros.rate("aws_batch", "us-east-1") is None  # dollar prices are not euro prices

    override.write_text('[aws_batch.us-east-1]\nvcpu_per_hour = -1\n')
    with pytest.raises(PriceError, match=r"prices.toml: aws_batch.us-east-1.vcpu_per_hour: .*greater than or equal"):
        PriceTable.load(override)
    override.write_text('[local.default]\nvcpu_per_hour = 1\nvcpu_per_second = 1\n')
    with pytest.raises(PriceError, match="vcpu_per_hour or vcpu_per_second, not both"):
        PriceTable.load(override)


async def test_a_bad_price_file_stops_the_server_naming_it(home: Path) -> None:
    settings = priced(home, "[local.default]\nvcpu_per_day = 1\n")
    with pytest.raises(CatalogError, match=r"prices.toml: local.default.vcpu_per_day"):
        ControlPlane(settings)


# ---- the estimate at submit ----------------------------------------------------------------------
async def test_the_cost_estimate_at_submit_learns_from_the_tools_history(home: Path) -> None:
    first = ControlPlane(priced(home))
    async with Client(build_server(first)) as client:
        agent = Agent(client)
        sub = await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 2.0})
        assert sub["estimated_runtime_seconds"] == 1  # the catalog's figure: no history yet
        assert sub["estimated_cost"]["amount"] == pytest.approx(FIRST_ESTIMATE)
        for tid in [sub["task_id"]] + [await agent.submit(inputs={"sleep_s": 2.0}) for _ in range(3)]:
            assert (await agent.wait(tid))["state"] == "succeeded"
    later = ControlPlane(priced(home))  # (another server: no estimate cached from before the runs)
    async with Client(build_server(later)) as client:
        agent = Agent(client)
        again = await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 2.0})
        await agent.call("cancel_task", task_id=again["task_id"])
        direct = await agent.call("exercise", sleep_s=2.0)  # a catalog tool called by name
        await agent.call("cancel_task", task_id=direct["task_id"])
    # Four runs of about 2 s weigh in: the runtime estimate and its cost moved toward them.
    runtime = again["estimated_runtime_seconds"]
    assert 1.3 < runtime < 2.5
    assert again["estimated_cost"]["amount"] == pytest.approx(runtime * (1 * VCPU_S + 2 * GIB_S), abs=1e-6)
    assert again["estimated_cost"]["amount"] > FIRST_ESTIMATE * 1.3


# ---- usage_report --------------------------------------------------------------------------------
async def test_usage_report_sums_by_tool_tag_and_owner_over_a_period_each_caller_its_own(home: Path) -> None:
    from tests.oidc import FakeIdP

    idp = FakeIdP().start()
    try:
        cp = ControlPlane(priced(home, auth_issuer=idp.issuer, auth_jwks_uri=idp.jwks_uri))
        async with serving(cp) as server:
            url = server.url

            def client(sub: str, *scopes: str) -> Client:
                return Client(url, auth=idp.token(sub, audience=url, scopes=["tasks:submit", "tasks:read", *scopes]))

            async with client("alice") as a, client("bob") as b, client("root", "tasks:admin") as root:
                alice, bob, admin = Agent(a), Agent(b), Agent(root)
                start = time.time()
                mine = [await alice.submit(inputs={"sleep_s": 0.5}, tags=["proj"]),
                        await alice.submit(inputs={"sleep_s": 0.5}, tags=["proj", "night"]),
                        await alice.submit("lj_relax", inputs={"n_atoms": 8, "max_steps": 50})]
                theirs = await bob.submit(inputs={"sleep_s": 0.5}, tags=["proj"])
                done = {t: await alice.wait(t) for t in mine} | {theirs: await bob.wait(theirs)}
                assert {s["state"] for s in done.values()} == {"succeeded"}
                cost = {t: s["estimated_cost"]["amount"] for t, s in done.items()}

                by_tool = await alice.call("usage_report", group_by=["tool"])
                assert by_tool["owner"] == f"{idp.issuer}#alice" and by_tool["currency"] == "USD"
                groups = {g["tool"]: g for g in by_tool["groups"]}
                assert sorted(groups) == ["exercise", "lj_relax"]  # bob's task is not alice's
                assert groups["exercise"]["tasks"] == 2 and groups["exercise"]["attempts"] == 2
                assert groups["exercise"]["estimated_cost"] == pytest.approx(cost[mine[0]] + cost[mine[1]], abs=2e-6)
                assert groups["lj_relax"]["estimated_cost"] == pytest.approx(cost[mine[2]], abs=1e-6)
                assert by_tool["total"]["estimated_cost"] == pytest.approx(sum(cost[t] for t in mine), abs=3e-6)
                assert by_tool["total"]["usage"]["run_seconds"] == pytest.approx(
                    sum(done[t]["usage"]["run_seconds"] for t in mine), abs=0.005)

                by_tag = await alice.call("usage_report", group_by=["tag"])
                tags = {g["tag"]: g["tasks"] for g in by_tag["groups"]}
                assert tags == {"proj": 2, "night": 1, None: 1} and "total" not in by_tag  # (a task per tag)

                # A period before the tasks ended holds none of them.
                before = await alice.call("usage_report", until=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                time.gmtime(start - 5)))
                assert before["groups"] == [] and before["total"]["estimated_cost"] == 0
                # Someone else's usage: what a caller who used nothing gets; everyone's is the admin's.
                assert (await alice.call("usage_report", owner=f"{idp.issuer}#bob"))["groups"] == []
                with pytest.raises(ToolCallError) as refused:
                    await alice.call("usage_report", everyone=True)
                assert refused.value.code == "FORBIDDEN"

                everyone = await admin.call("usage_report", group_by=["owner"], everyone=True)
                owners = {g["owner"]: g["tasks"] for g in everyone["groups"]}
                assert owners == {f"{idp.issuer}#alice": 3, f"{idp.issuer}#bob": 1}
                just_bob = await admin.call("usage_report", owner=f"{idp.issuer}#bob", group_by=["tool", "tag"])
                assert [(g["tool"], g["tag"], g["tasks"]) for g in just_bob["groups"]] == [("exercise", "proj", 1)]
                assert just_bob["groups"][0]["estimated_cost"] == pytest.approx(cost[theirs], abs=1e-6)
    finally:
        idp.stop()
    # The operator's command line reads the same sums from the database.
    shown = cli(home, "usage", "--by", "owner", "--by", "tool", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {(g["owner"], g["tool"]): g["tasks"] for g in json.loads(shown.stdout)["groups"]}
    assert rows == {(f"{idp.issuer}#alice", "exercise"): 2, (f"{idp.issuer}#alice", "lj_relax"): 1,
                    (f"{idp.issuer}#bob", "exercise"): 1}
    assert "usage" in cli(home, "usage").stdout


async def test_usage_report_at_the_edges_answers_a_report_never_internal(home: Path) -> None:
    """Empty groupings, periods with nothing in them, times at the ends of what a date can be and
    zones that carry them past it: each is a report (schema-valid, so never refused), and the
    one total of `group_by: []` is the sum of what ran."""
    cp = ControlPlane(priced(home))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        done = await agent.wait(await agent.submit(inputs={"sleep_s": 0.2}))
        assert done["state"] == "succeeded"

        one = await agent.call("usage_report", group_by=[])
        assert one["group_by"] == [] and len(one["groups"]) == 1
        assert one["groups"][0]["tasks"] == 1 and one["groups"][0]["attempts"] == 1
        assert one["total"]["estimated_cost"] == pytest.approx(done["estimated_cost"]["amount"], abs=1e-6)

        edges = [  # (arguments, since, until) as the answer writes them
            ({"until": "2020-01-15T00:00:00Z", "group_by": []}, "2020-01-01T00:00:00.000Z", "2020-01-15T00:00:00.000Z"),
            ({"until": "2020-03-01T00:00:00Z"}, "2020-02-01T00:00:00.000Z", "2020-03-01T00:00:00.000Z"),
            ({"until": "1970-01-01T00:00:00Z", "group_by": []}, "1969-12-01T00:00:00.000Z", "1970-01-01T00:00:00.000Z"),
            ({"until": "9999-12-15T00:00:00Z"}, "9999-12-01T00:00:00.000Z", "9999-12-15T00:00:00.000Z"),
            ({"until": "9999-12-31T23:59:59-05:00", "group_by": ["tag"]}, "9999-12-01T00:00:00.000Z",
             "9999-12-31T23:59:59.000Z"),
            ({"since": "0001-01-01T00:00:00+05:00", "until": "0001-02-01T00:00:00Z", "group_by": ["owner"]},
             "0001-01-01T00:00:00.000Z", "0001-02-01T00:00:00.000Z"),
            ({"until": "0001-01-01T00:00:00Z"}, "0001-01-01T00:00:00.000Z", "0001-01-01T00:00:00.000Z"),
        ]
        for args, since, until in edges:
            report = await agent.call("usage_report", **args)
            assert (report["since"], report["until"], report["groups"]) == (since, until, []), (args, report)
        # all of time holds the one run
        everything = await agent.call("usage_report", since="0001-01-01T00:00:00Z", until="9999-12-31T23:59:59Z",
                                      group_by=[])
        assert everything["groups"][0]["tasks"] == 1
        # what stays refused is what no schema can say: a since that is not before its until
        err = await agent.error("usage_report", since="2020-02-01T00:00:00Z", until="2020-01-01T00:00:00Z")
        assert err["code"] == "INVALID_REQUEST" and err["message"] == "since: must be before until"


# ---- budgets -------------------------------------------------------------------------------------
async def test_a_submit_that_would_exceed_a_budget_is_refused_and_creates_nothing(home: Path) -> None:
    cp = ControlPlane(priced(home, limits_refresh_s=0.2))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        spent_tid = await agent.submit()
        spent = (await agent.wait(spent_tid))["estimated_cost"]["amount"]
        assert spent > 0
        # Room for two more tasks of the first estimate, not three (spent + running + this one).
        budget = round(spent + 2.5 * FIRST_ESTIMATE, 6)
        assert cli(home, "budgets", "set", str(budget), "--owner", "local", "--period", "month").returncode == 0
        assert cli(home, "budgets", "set", "0.01", "--tag", "proj").returncode == 0
        listed = json.loads(cli(home, "budgets", "list", "--json").stdout)
        assert listed == {"currency": "USD", "budgets": [
            {"scope": "owner", "subject": "local", "period": "month", "amount": budget},
            {"scope": "tag", "subject": "proj", "period": "month", "amount": 0.01}]}
        await anyio.sleep(0.6)  # every server reads the budgets again within limits_refresh_s

        running = [await agent.submit(inputs={"sleep_s": 60}) for _ in range(2)]
        err = await agent.error("submit_task", tool_name="exercise", inputs={}, idempotency_key="third")
        assert err["code"] == "LIMIT_EXCEEDED" and err["limit"] == "budget" and err["max"] == budget, err
        assert err["budget"] == {"scope": "owner", "period": "month", "currency": "USD", "spent": spent,
                                 "running": pytest.approx(2 * FIRST_ESTIMATE), "estimated_cost": FIRST_ESTIMATE}
        days_left = 32 * 86400
        assert isinstance(err["retry_after_s"], int) and 1 <= err["retry_after_s"] <= days_left  # the month's end
        assert "Traceback" not in err["message"] and err["hint"]
        direct = await agent.error("exercise")  # a catalog tool called by name counts the same
        assert direct["code"] == "LIMIT_EXCEEDED" and direct["limit"] == "budget"
        # Nothing was created: no task, and the idempotency key is still free.
        assert sum(cp.store.tasks.count_by_state().values()) == 3
        assert cp.store.tasks.find_idempotent("local", "exercise", "third") is None
        for tid in running:
            await agent.call("cancel_task", task_id=tid)

        assert cli(home, "budgets", "clear", "--owner", "local").returncode == 0
        assert cli(home, "budgets", "clear", "--owner", "local").returncode == 1  # nothing left to clear
        await anyio.sleep(0.6)
        assert (await agent.call("submit_task", tool_name="exercise", inputs={}, idempotency_key="third"))["task_id"]
        # The tag's budget still holds: one task of 0.012 is more than 0.01 (whoever submits it).
        tagged = await agent.error("submit_task", tool_name="exercise", inputs={}, tags=["night", "proj"])
        assert tagged["code"] == "LIMIT_EXCEEDED" and tagged["budget"]["scope"] == "tag", tagged
        assert tagged["budget"]["tag"] == "proj" and "for tag 'proj'" in tagged["message"]
        assert sum(cp.store.tasks.count_by_state().values()) == 4


async def test_a_budget_holds_for_concurrent_submits_across_two_control_planes(home: Path) -> None:
    replicas = [ControlPlane(priced(home))]
    replicas[0].store.usage.set_budget("owner", "local", "day", round(5.5 * FIRST_ESTIMATE, 6))  # five fit
    replicas.append(ControlPlane(priced(home)))  # (reads the budgets as it starts)
    replicas[0].service.budgets.refresh()
    answers: list[tuple[bool, dict[str, Any]]] = []
    async with Client(build_server(replicas[0])) as c0, Client(build_server(replicas[1])) as c1:
        async def submit(i: int) -> None:
            res = await (c0, c1)[i % 2].call_tool("submit_task", {"tool_name": "exercise", "inputs": {"sleep_s": 60},
                                                                  "idempotency_key": f"k{i}"}, raise_on_error=False)
            answers.append((res.is_error, json.loads(res.content[0].text)))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(submit, i)
        created = [a for err, a in answers if not err]
        refused = [a for err, a in answers if err]
        for a in created:
            await Agent(c0).call("cancel_task", task_id=a["task_id"])
    assert len(created) == 5 and len(refused) == 15
    assert {(r["code"], r["limit"]) for r in refused} == {("LIMIT_EXCEEDED", "budget")}
    assert sum(replicas[0].store.tasks.count_by_state().values()) == 5


async def test_without_a_budget_a_submit_runs_no_statement_more(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget statements run only for a submit that a budget applies to (flip: then they run)."""
    budget_statements = {id(s) for s in (q.OWNER_SPENT, q.OWNER_RUNNING, q.TAG_SPENT, q.TAG_RUNNING)}

    async def statements_of_a_submit(cp: ControlPlane) -> list[Any]:
        seen = record_statements(cp, monkeypatch)
        async with Client(build_server(cp)) as client:
            await Agent(client).submit(tags=["proj"])
        return seen

    def spent_on_budgets(seen: list[Any]) -> list[Any]:
        return [s for s in seen if id(s) in budget_statements or (isinstance(s, str) and s.startswith("budget:"))]

    assert not spent_on_budgets(await statements_of_a_submit(ControlPlane(priced(home))))
    cp = ControlPlane(priced(home))
    cp.store.usage.set_budget("owner", "someone else", "month", 1.0)
    cp.store.usage.set_budget("tag", "another tag", "month", 1.0)
    cp.service.budgets.refresh()
    assert not spent_on_budgets(await statements_of_a_submit(cp))  # budgets of others: still none
    cp = ControlPlane(priced(home))
    cp.store.usage.set_budget("owner", "local", "month", 1.0)
    cp.store.usage.set_budget("tag", "proj", "week", 1.0)
    cp.service.budgets.refresh()
    assert {id(s) for s in spent_on_budgets(await statements_of_a_submit(cp))} >= budget_statements
