"""`controlplane demo`: the whole path once, on the embedded defaults.

Starts a control plane (SQLite, local provider, local object store) with its MCP server on a
loopback port, then acts as an agent through a real MCP client over HTTP: submits `lj_relax`,
follows its progress with a progress bar, tails its logs, prints its result, and downloads the
trajectory artifact through its signed link, checking its size and sha256.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any, cast

import httpx
from fastmcp import Client
from mcp_types import TextContent
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from controlplane.app import ControlPlane
from controlplane.serve import HttpServer
from controlplane.settings import Settings
from controlplane.states import FINAL


async def _call(client: Client[Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await client.call_tool(tool, args, raise_on_error=False)
    data = res.structured_content or json.loads(cast(TextContent, res.content[0]).text)
    if res.is_error:
        raise RuntimeError(f"{tool}: {data.get('code')}: {data.get('message')}")
    return data


async def run_demo(settings: Settings, console: Console, inputs: dict[str, Any]) -> int:
    cp = ControlPlane(settings)
    http = HttpServer(cp, "127.0.0.1", 0)
    server_task = asyncio.create_task(http.serve())
    try:
        while not http.started:
            if server_task.done():
                await server_task
            await asyncio.sleep(0.02)
        console.print(f"[bold]mcp-controlplane[/] serving MCP at [cyan]{http.url}[/] (home: {settings.home})")
        async with Client(http.url) as client:
            tools = [t.name for t in await client.list_tools()]
            console.print(f"tools: {', '.join(tools)}")
            sub = await _call(client, "lj_relax", inputs)
            task_id = sub["task_id"]
            console.print(f"submitted [bold]lj_relax[/] {json.dumps(inputs)} -> task [green]{task_id}[/] "
                          f"({sub['state']}, estimated {sub['estimated_runtime_seconds']:.0f} s)")
            status = await _follow(client, task_id, console)
            logs = await _call(client, "tail_task_logs", {"task_id": task_id, "from_end": True, "limit": 5})
            console.print("[bold]last log lines[/]")
            for line in logs["lines"]:
                console.print(f"  {line['seq']:>6} {line['stream']:<6} {line['message']}")
            result = await _call(client, "get_task_result", {"task_id": task_id})
            if status["state"] != "succeeded":
                console.print(f"[red]task ended {status['state']}[/]: {result.get('error')}")
                return 1
            table = Table(title="result")
            table.add_column("field")
            table.add_column("value")
            for k, v in result["result"].items():
                table.add_row(k, str(v))
            console.print(table)
            for art in result["artifacts"]:
                ok = await _verify(art)
                console.print(f"artifact [bold]{art['name']}[/] ({art['kind']}, {art['size_bytes']} bytes, "
                              f"sha256 {art['sha256'][:12]}..., link expires {art['expires_at']})")
                console.print(f"  {art['download_url']}", soft_wrap=True, highlight=False)  # copyable
                console.print("  downloaded and verified: size and sha256 match" if ok
                              else "  [red]download did not match its sha256[/]")
                if not ok:
                    return 1
        return 0
    finally:
        http.stop()
        await server_task


async def _follow(client: Client[Any], task_id: str, console: Console) -> dict[str, Any]:
    with Progress(TextColumn("[bold blue]{task.fields[state]:<10}"), BarColumn(), TaskProgressColumn(),
                  TextColumn("{task.fields[msg]}"), TimeElapsedColumn(), console=console) as bar:
        row = bar.add_task("lj_relax", total=100, state="queued", msg="")
        while True:
            st = await _call(client, "get_task_status", {"task_id": task_id})
            p = st.get("progress") or {}
            bar.update(row, completed=p.get("percent") or 0, state=st["state"], msg=p.get("message") or "")
            if st["state"] in FINAL:
                return st
            await asyncio.sleep(0.2)


async def _verify(art: dict[str, Any]) -> bool:
    sha = hashlib.sha256()
    size = 0
    async with httpx.AsyncClient(timeout=30) as http, http.stream("GET", art["download_url"]) as resp:
        if resp.status_code != 200:
            return False
        async for chunk in resp.aiter_bytes():
            sha.update(chunk)
            size += len(chunk)
    intact: bool = size == art["size_bytes"] and sha.hexdigest() == art["sha256"]
    return intact


def demo(settings: Settings, inputs: dict[str, Any]) -> int:
    console = Console()
    t0 = time.monotonic()
    code = asyncio.run(run_demo(settings, console, inputs))
    console.print(f"done in {time.monotonic() - t0:.1f} s" if code == 0 else "[red]demo failed[/]")
    return code
