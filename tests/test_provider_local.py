"""The local provider passes the provider contract suite (`tests/provider_contract.py`)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest

from providers.base import Handle
from providers.local import LocalProvider
from tests.provider_contract import Harness, ProviderContract


class LocalHarness(Harness):
    def __init__(self, home: Path):
        self.provider = LocalProvider.configured(home, kill_grace_s=1.0)
        self.options = LocalProvider.Options()

    def count_jobs(self, job_name: str) -> int:
        console = self.provider.jobs_dir / job_name / "console.log"
        return console.read_text().count("# launching ") if console.exists() else 0

    def forget(self, handle: Handle) -> None:
        """The runner dies without a word (SIGKILL) and leaves no outcome behind."""
        try:
            runner = psutil.Process(handle["pid"])
            victims = [runner, *runner.children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for p in victims:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        psutil.wait_procs(victims, timeout=5)
        self.provider.poll([handle])  # reaps our own child
        (Path(handle["job_dir"]) / "exit.json").unlink(missing_ok=True)


class TestLocalContract(ProviderContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> LocalHarness:
        return LocalHarness(tmp_path / "home")


def test_runner_pid_file_names_the_runner(tmp_path: Path) -> None:
    """find() after a crash relies on runner.pid; it names the live runner process."""
    h = LocalHarness(tmp_path / "home")
    spec = h.spec("cp-pidfile-a1", "import time; time.sleep(5)")
    handle = h.provider.launch(spec)
    recorded = json.loads((Path(handle["job_dir"]) / "runner.pid").read_text())
    assert recorded["pid"] == handle["pid"] and psutil.pid_exists(handle["pid"])
    h.forget(handle)
