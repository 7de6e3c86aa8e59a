"""A sweep of the echo tool run to its end through an MCP client, for the tests that run one on
the clouds' fakes (`tests/test_sweeps_cloud.py`, `tests/test_sweep_failover.py`): submit, poll
its status until every shard has ended (each turn handed to the test's own action: a storm, a
site going down), then read every result back and the shards' tasks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from controlplane.app import ControlPlane
from controlplane.store.rows import TaskRow
from tests.conftest import Agent
from tests.test_sweeps import all_results


@dataclass(frozen=True)
class SweepRun:
    sweep_id: str
    status: dict[str, Any]  # get_sweep_status once done
    took: float  # seconds from the submit to done
    results: list[dict[str, Any]]  # every shard's, in shard order
    tasks: list[TaskRow]  # the shards' tasks, in shard order


async def run_sweep(agent: Agent, cp: ControlPlane, shards: int, each_turn: Callable[[dict[str, Any]], None],
                    timeout_s: float) -> SweepRun:
    """Submit a sweep of `shards` shards of `exercise`, shard i with inputs `{"result": {"i": i}}`,
    and poll its status every 0.5 s, calling `each_turn` with each status not yet done, until it is
    done (AssertionError after `timeout_s`)."""
    t0 = time.monotonic()
    s = await agent.call("submit_sweep", tool_name="exercise",
                         vary={"list": [{"result": {"i": i}} for i in range(shards)]})
    sid = s["sweep_id"]
    deadline = t0 + timeout_s
    while not (st := await agent.call("get_sweep_status", sweep_id=sid))["done"]:
        assert time.monotonic() < deadline, f"not done: {st}"
        each_turn(st)
        await anyio.sleep(0.5)
    took = time.monotonic() - t0
    return SweepRun(sid, st, took, await all_results(agent, sid, limit=200), cp.store.sweeps.page(sid, 0, shards))
