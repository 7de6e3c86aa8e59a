"""The "your first tool" example (README.md and docs/first-tool.md) works as written: its catalog and
its code, saved as the page says, served by a real `controlplane serve` over stdio and called by a
real MCP client, give the result, progress, log line and artifact the page promises."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from tests.conftest import ROOT, fast_env

pytestmark = pytest.mark.anyio

PLACEHOLDER = "/home/you/mytools"  # where the page says to save the tool


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL)


def example(path: Path) -> tuple[str, str]:
    """The page's catalog (the TOML block with [tools.primes]) and tool code (the Python block using toolkit)."""
    (catalog,) = [b for b in blocks(path, "toml") if "[tools.primes]" in b]
    (code,) = [b for b in blocks(path, "python") if "from controlplane_runner import toolkit" in b]
    return catalog, code


def test_the_readme_and_the_guide_show_the_same_example() -> None:
    assert example(ROOT / "README.md") == example(ROOT / "docs" / "first-tool.md")


def payload(result: Any) -> dict[str, Any]:
    return json.loads(result.content[0].text)


async def test_the_first_tool_runs_as_written(tmp_path: Path) -> None:
    catalog, code = example(ROOT / "docs" / "first-tool.md")
    tools = tmp_path / "mytools"
    tools.mkdir()
    (tools / "primes.py").write_text(code)
    assert PLACEHOLDER in catalog
    (tmp_path / "catalog.toml").write_text(catalog.replace(PLACEHOLDER, str(tools)))

    env = fast_env(tmp_path / "home", catalog_path=tmp_path / "catalog.toml")
    transport = StdioTransport(command=sys.executable, args=["-m", "controlplane.cli", "serve"], env=env,
                               cwd=str(tmp_path))
    async with Client(transport) as client:
        assert "primes" in {t.name for t in await client.list_tools()}
        first = payload(await client.call_tool("primes", {"n": 100_000}))  # the two-stage answer
        assert first["state"] == "queued" and first["estimated_runtime_seconds"] > 0
        task_id = first["task_id"]

        done = payload(await client.call_tool("wait_task", {"task_id": task_id, "timeout_s": 120}))
        assert done["state"] == "succeeded", done
        status = payload(await client.call_tool("get_task_status", {"task_id": task_id}))
        assert status["progress"]["percent"] == 100.0
        result = payload(await client.call_tool("get_task_result", {"task_id": task_id}))
        assert result["result"] == {"n": 100_000, "count": 9592, "largest": 99991}
        (artifact,) = result["artifacts"]
        assert artifact["name"] == "primes.txt" and artifact["kind"] == "table"
        primes = Path(urlparse(artifact["file_url"]).path).read_text().split()
        assert len(primes) == 9592 and primes[:4] == ["2", "3", "5", "7"]
        logs = payload(await client.call_tool("tail_task_logs", {"task_id": task_id}))
        assert "sieving below 100000" in [line["message"] for line in logs["lines"]]

        # the invalid input the page promises to refuse, refused before anything runs
        refused = await client.call_tool("primes", {"n": 1}, raise_on_error=False)
        assert refused.is_error and payload(refused)["code"] == "INVALID_REQUEST"
