"""list_tasks pages: whatever the filters, paging with the cursor yields exactly the matching
tasks, newest first, each once (checked against a brute-force answer)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from sqlalchemy import text

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.store import NewTask

STATES = ["queued", "succeeded", "failed", "cancelled"]
TAGS = ["a", "b", "c"]


@pytest.fixture
def populated(cp: ControlPlane) -> list[dict[str, Any]]:
    rng = random.Random(5)
    made = []
    for i in range(80):
        tags = rng.sample(TAGS, rng.randrange(0, 3))
        owner = "me" if i % 7 else "someone-else"
        task = cp.store.tasks.submit(NewTask(
            owner=owner, tool_name=rng.choice(["exercise", "lj_relax"]), inputs_json="{}", input_size=None,
            provider="local", resource_class="cpu_small", priority=0, ttl_s=3600, idempotency_key=None, tags=tags,
            resources_json="{}", max_runtime_s=60, max_attempts=1, estimate_s=1.0)).task
        state = rng.choice(STATES)
        ts = 1_000_000 + rng.choice([i, i, 5])  # duplicate submission times: the pk breaks ties
        with cp.db.write() as c:
            c.execute(text("update tasks set state=:s, submitted_at=:ts where task_id=:t"),
                      {"s": state, "ts": ts, "t": task.task_id})
            c.execute(text("update task_tags set submitted_at=:ts where task_pk=:pk"), {"ts": ts, "pk": task.pk})
        made.append({"task_id": task.task_id, "pk": task.pk, "tool_name": task.tool_name, "state": state, "submitted_at": ts, "tags": tags, "owner": owner})
    return made


FILTERS = [
    {},
    {"states": ["failed"]},
    {"states": ["failed", "queued", "cancelled"]},
    {"tool_name": "lj_relax"},
    {"tags_any": ["a"]},
    {"tags_any": ["a", "c"]},
    {"tags_any": ["b", "c"], "states": ["succeeded", "failed"], "tool_name": "exercise"},
    {"submitted_after": "1970-01-12T13:47:00Z"},
]


@pytest.mark.parametrize("filters", FILTERS, ids=[str(f) for f in FILTERS])
def test_pages_cover_exactly_the_matching_tasks(cp: ControlPlane, populated: list[dict[str, Any]],
                                               filters: dict[str, Any]) -> None:
    def matches(t: dict[str, Any]) -> bool:
        return (t["owner"] == "me"
                and ("states" not in filters or t["state"] in filters["states"])
                and ("tool_name" not in filters or t["tool_name"] == filters["tool_name"])
                and ("tags_any" not in filters or set(t["tags"]) & set(filters["tags_any"]))
                and ("submitted_after" not in filters or t["submitted_at"] >= 1_000_020))

    expected = [t["task_id"] for t in sorted(filter(matches, populated),
                                             key=lambda t: (t["submitted_at"], t["pk"]), reverse=True)]
    got, cursor = [], None
    while True:
        args = json.dumps({**filters, "limit": 7, "cursor": cursor})
        page = cp.service.list("me", api.ListTasks.model_validate_json(args))
        got += [t["task_id"] for t in page["tasks"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert got == expected and expected
