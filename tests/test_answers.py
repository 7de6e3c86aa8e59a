"""The task service's answer models (controlplane.service.answers) describe the tools' answers
exactly: every answer a real client gets over HTTP, in each state a task passes through, is its
model's JSON schema's instance, and the model writes it back byte for byte (same keys, same order,
the same optional keys left out)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import jsonschema
import pytest
from fastmcp import Client
from pydantic import BaseModel

from controlplane.service import answers
from tests.conftest import ServerProcess

pytestmark = pytest.mark.anyio

UNKNOWN_ID = "tsk_" + "a" * 26


class Checked:
    """A client that checks each answer against the model of the tool's answer."""

    def __init__(self, client: Client):
        self.client = client
        self.seen: set[str] = set()

    async def call(self, tool: str, model: type[BaseModel], **args: Any) -> dict[str, Any]:
        res = await self.client.call_tool(tool, args, raise_on_error=False)
        text = res.content[0].text
        assert not res.is_error, text
        data = json.loads(text)
        jsonschema.validate(data, model.model_json_schema(mode="serialization", by_alias=True))
        parsed = model.model_validate(data)
        assert json.dumps(parsed.dump(), separators=(",", ":")) == text  # type: ignore[attr-defined]
        self.seen.add(model.__name__)
        return data


@pytest.fixture
def server(server_process: ServerProcess) -> ServerProcess:
    return server_process.start()


async def test_every_answer_is_its_model_byte_for_byte(server: ServerProcess) -> None:
    async with Client(server.url) as c:
        agent = Checked(c)
        done = (await agent.call("submit_task", answers.SubmitAnswer, tool_name="exercise", idempotency_key="k",
                                 inputs={"log_lines": 3, "artifact_bytes": 100, "result": {"x": 1}}, tags=["a"]))
        again = await agent.call("submit_task", answers.SubmitAnswer, tool_name="exercise", idempotency_key="k",
                                 inputs={"log_lines": 3, "artifact_bytes": 100, "result": {"x": 1}}, tags=["a"])
        assert again["deduplicated"] is True and "deduplicated" not in done
        direct = await agent.call("exercise", answers.SubmitAnswer, sleep_s=60, progress_steps=60)
        assert direct["message"].startswith("exercise queued as task")
        running = direct["task_id"]
        queued = await agent.call("get_task_result", answers.TaskResult, task_id=running)
        assert "message" in queued and "poll_after_ms" in queued
        for _ in range(600):
            st = await agent.call("get_task_status", answers.TaskStatus, task_id=running)
            if st["state"] == "running" and st["progress"]:
                break
            await anyio.sleep(0.05)
        assert st["state"] == "running" and "eta_s" in st["progress"]
        for _ in range(600):
            if (await agent.call("get_task_status", answers.TaskStatus, task_id=done["task_id"]))["state"] == "succeeded":
                break
            await anyio.sleep(0.05)
        res = await agent.call("get_task_result", answers.TaskResult, task_id=done["task_id"])
        assert res["result"]["ok"] is True and res["artifacts"] and "message" not in res and "poll_after_ms" not in res
        page = await agent.call("tail_task_logs", answers.LogPage, task_id=done["task_id"])
        assert page["lines"]
        await agent.call("tail_task_logs", answers.LogPage, task_id=done["task_id"], from_end=True, limit=1)
        own = await agent.call("tail_task_logs", answers.ProviderLogPage, task_id=done["task_id"], source="provider")
        assert own["source"] == "provider"
        listed = await agent.call("list_tasks", answers.TaskList, limit=1)
        assert listed["next_cursor"] and "owner" not in listed["tasks"][0]
        await agent.call("list_tasks", answers.TaskList, cursor=listed["next_cursor"])
        await agent.call("list_tasks", answers.TaskList, owner="someone else")
        stop = await agent.call("cancel_task", answers.CancelAnswer, task_id=running)
        assert stop["acknowledged"] is True and "message" not in stop
        late = await agent.call("cancel_task", answers.CancelAnswer, task_id=done["task_id"])
        assert late["acknowledged"] is False and late["message"]
        await agent.call("usage_report", answers.UsageReport)
        by_tag = await agent.call("usage_report", answers.UsageReport, group_by=["tag"])
        assert "total" not in by_tag
        gone = await c.call_tool("get_task_status", {"task_id": UNKNOWN_ID}, raise_on_error=False)
        assert gone.is_error and json.loads(gone.content[0].text)["code"] == "NOT_FOUND"
    assert agent.seen == {"SubmitAnswer", "TaskResult", "TaskStatus", "LogPage", "ProviderLogPage", "TaskList",
                          "CancelAnswer", "UsageReport"}
