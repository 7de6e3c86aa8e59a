"""The dashboard in a real browser: headless Chromium (Debian's `chromium` package) driven by
Playwright with that browser (`executable_path`; nothing is downloaded). The page lists the
tasks, a task's page follows it to `succeeded` live (server-sent events) with its log lines, and
another task is cancelled from its page after the confirmation dialog. A screenshot is saved.

Without chromium the test skips, unless CONTROLPLANE_REQUIRE_CHROMIUM=1 (`.ci/run`) makes it fail.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from tests.conftest import Agent

pytestmark = pytest.mark.anyio


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CONTROLPLANE_REQUIRE_CHROMIUM") == "1":
            pytest.fail("chromium is required (CONTROLPLANE_REQUIRE_CHROMIUM=1): apt-get install chromium")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return path


async def test_a_browser_follows_a_task_to_its_end_and_cancels_another(http_server: Any, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright, expect

    browser_path = chromium()
    root = http_server.url.removesuffix("/mcp")
    async with Client(http_server.url) as client:
        agent = Agent(client)
        async with async_playwright() as pw:
            # The browser before the tasks: it takes seconds to start on a busy machine, and the
            # followed task must still be running when its page opens.
            browser = await pw.chromium.launch(executable_path=browser_path, headless=True)
            try:
                page = await browser.new_page()
                followed = await agent.submit("exercise", inputs={"sleep_s": 6, "progress_steps": 6, "log_lines": 5,
                                                                  "artifact_bytes": 2048})
                doomed = await agent.submit("exercise", inputs={"sleep_s": 120})
                await page.goto(f"{root}/dashboard")
                await expect(page.locator(f'tr[data-task="{followed}"]')).to_be_visible()
                await expect(page.locator(f'tr[data-task="{doomed}"]')).to_be_visible()
                await expect(page.locator('tr[data-queue="cpu_small"]')).to_contain_text("2")

                await page.click(f'a[href="/dashboard/tasks/{followed}"]')
                await expect(page.locator("#state")).to_have_text("running", timeout=30_000)
                opened_at = page.url
                await expect(page.locator("#artifacts")).to_have_text("once the task ends")
                await expect(page.locator("#state")).to_have_text("succeeded", timeout=60_000)
                await expect(page.locator("#logs")).to_contain_text("line 4")
                await expect(page.locator("#percent")).to_have_text("100")
                status = await agent.call("get_task_status", task_id=followed)
                assert status["state"] == "succeeded"
                # The end, as it happened, without a reload: the artifact's link, the timeline's
                # last move and what the task cost, as get_task_status reports it.
                await expect(page.locator("#artifacts a")).to_have_text("data.bin", timeout=10_000)
                await expect(page.locator("#timeline")).to_contain_text("→ succeeded")
                cost = status["estimated_cost"]
                await expect(page.locator("#cost")).to_contain_text(f"{cost['amount']:.6f} {cost['currency']}")
                await expect(page.locator("#cost")).to_contain_text(f"{status['usage']['run_seconds']:g} s run")
                await expect(page.locator("#completed")).not_to_be_empty()
                assert page.url == opened_at
                await page.screenshot(path=str(tmp_path / "followed.png"), full_page=True)

                await page.goto(f"{root}/dashboard/tasks/{doomed}")
                await expect(page.locator("#state")).to_have_text("running", timeout=30_000)
                await expect(page.locator("#cost")).to_contain_text("so far")  # recorded while it runs
                asked: list[str] = []

                async def confirm(dialog: Any) -> None:
                    asked.append(dialog.message)
                    await dialog.accept()

                page.on("dialog", confirm)
                await page.click("#cancel")
                await expect(page.locator("#state")).to_have_text("cancelled", timeout=60_000)
                assert asked and doomed in asked[0]
                assert (await agent.call("get_task_status", task_id=doomed))["state"] == "cancelled"
                shot = tmp_path / "dashboard.png"
                await page.goto(f"{root}/dashboard")
                await expect(page.locator(f'tr[data-task="{doomed}"] .state')).to_have_text("cancelled")
                await page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
            finally:
                await browser.close()


async def test_a_browser_sees_a_sweep_as_one_row_live_and_opens_its_shards(http_server: Any) -> None:
    from playwright.async_api import async_playwright, expect

    browser_path = chromium()
    root = http_server.url.removesuffix("/mcp")
    async with Client(http_server.url) as client:
        agent = Agent(client)
        s = await agent.call("submit_sweep", tool_name="exercise", max_parallel=2,
                             vary={"list": [{"sleep_s": 0.5, "result": {"i": i}} for i in range(8)]})
        sid = s["sweep_id"]
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=browser_path, headless=True)
            try:
                page = await browser.new_page()
                await page.goto(f"{root}/dashboard")
                row = page.locator(f'tr[data-sweep="{sid}"]')
                await expect(row).to_have_count(1)
                await expect(page.locator("tr[data-task]")).to_have_count(0)  # no shard has a row
                # the list refreshes itself: the same row, until all 8 have ended
                await expect(row.locator(".shards")).to_contain_text("8/8 0 run 0 failed", timeout=60_000)
                await expect(row.locator(".state")).to_have_text("succeeded")
                await row.locator(f'a[href="/dashboard/sweeps/{sid}"]').click()
                await expect(page.locator("#counts")).to_have_text("8 succeeded")
                await expect(page.locator("tr[data-shard]")).to_have_count(8)
                shard = page.locator('tr[data-shard="5"] a')
                task_id = await shard.text_content()
                await shard.click()
                await expect(page.locator("#state")).to_have_text("succeeded")
                assert page.url.endswith(f"/dashboard/tasks/{task_id}")
            finally:
                await browser.close()
