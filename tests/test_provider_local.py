"""The local provider passes the provider contract suite (`tests/provider_contract.py`); its handle
reads what earlier versions stored; `release` deletes an ended job's directory and nothing else."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from controlplane_providers.base import JobPhase, LaunchSpec, MalformedHandle
from controlplane_providers.local import LocalHandle, LocalProvider
from tests.conftest import runner_starts
from tests.provider_contract import ENDED, SLEEP, Harness, ProviderContract, poll_one, wait_for


class LocalHarness(Harness):
    def __init__(self, home: Path):
        self.provider = LocalProvider.configured(home, kill_grace_s=1.0)
        self.options = LocalProvider.Options()

    def count_jobs(self, job_name: str) -> int:
        """Runners that started the job (each says so on the job's console as it claims it)."""
        return runner_starts(self.provider.jobs_dir / job_name)

    def forget(self, handle: LocalHandle) -> None:
        """The runner dies without a word (SIGKILL) and leaves no outcome behind."""
        try:
            runner = psutil.Process(handle.pid)
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
        (Path(handle.job_dir) / "exit.json").unlink(missing_ok=True)


class TestLocalContract(ProviderContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> LocalHarness:
        return LocalHarness(tmp_path / "home")


def test_runner_pid_file_names_the_runner(tmp_path: Path) -> None:
    """find() after a crash relies on runner.pid; it names the live runner process."""
    h = LocalHarness(tmp_path / "home")
    spec = h.spec("cp-pidfile-a1", "import time; time.sleep(5)")
    handle = h.provider.launch(spec)
    recorded = json.loads((Path(handle.job_dir) / "runner.pid").read_text())
    assert recorded["pid"] == handle.pid and psutil.pid_exists(handle.pid)
    assert abs(recorded["claimed_at"] - handle.launched_at) < 30
    h.forget(handle)


class StoppedAfterItsLook(LocalProvider):
    """A launcher that stops (a leader stopped with SIGSTOP) after its look for the job found none,
    before it starts a runner, until `wake` is set."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.looked = threading.Event()
        self.wake = threading.Event()

    def find(self, spec: LaunchSpec) -> LocalHandle | None:
        found = super().find(spec)
        if not self.looked.is_set():
            self.looked.set()
            assert self.wake.wait(30)
        return found


def test_a_launcher_that_wakes_after_another_launched_the_job_adopts_that_runner(tmp_path: Path) -> None:
    """Two launchers of one job (an old leader and its successor) on one jobs directory. The first
    stops after looking and finding nothing; the second launches; the first wakes and starts its
    runner. The tool runs once and both launchers are handed the one runner that runs it."""
    home = tmp_path / "home"
    marks = tmp_path / "ran.txt"
    script = f"open({str(marks)!r}, 'a').write('ran\\n'); import time; time.sleep(1)"
    old = StoppedAfterItsLook.configured(home, kill_grace_s=1.0)
    new = LocalProvider.configured(home, kill_grace_s=1.0)
    spec = LocalHarness(home).spec("cp-twice-a1", script)
    woke: list[LocalHandle] = []
    waking = threading.Thread(target=lambda: woke.append(old.launch(spec)))
    waking.start()
    try:
        assert old.looked.wait(30)
        launched = new.launch(spec)  # the successor looks, finds nothing, launches
    finally:
        old.wake.set()  # ... and the old leader wakes and starts a runner of its own
        waking.join(60)
    assert woke and woke[0].pid == launched.pid  # the old launcher got the successor's runner
    assert wait_for(new, launched, ENDED).phase == JobPhase.SUCCEEDED
    assert marks.read_text() == "ran\n"  # the tool ran once
    job_dir = Path(launched.job_dir)
    assert runner_starts(job_dir) == 1
    console = (job_dir / "console.log").read_text()
    assert f"# not started: cp-twice-a1 already has its runner (pid {launched.pid})" in console, console
    assert json.loads((job_dir / "exit.json").read_text())["status"] == "succeeded"


def test_a_job_whose_runner_died_without_an_outcome_is_found_gone_not_started_again(tmp_path: Path) -> None:
    """A runner claimed the job and was killed before it reported (the server was down meanwhile):
    find returns it, polled it is gone, and a launch of the same attempt starts nothing new."""
    h = LocalHarness(tmp_path / "home")
    spec = h.spec("cp-died-a1", SLEEP.format(s=30))
    handle = h.provider.launch(spec)
    h.forget(handle)
    found = h.provider.find(spec)
    assert found is not None and poll_one(h.provider, found).phase == JobPhase.GONE
    again = h.provider.launch(spec)
    assert again.pid == handle.pid and poll_one(h.provider, again).phase == JobPhase.GONE
    assert runner_starts(Path(handle.job_dir)) == 1


# ---- handles as earlier versions stored them ----------------------------------------------------
# jobs.handle_json of a database written before handles were typed, exactly as that code wrote
# it: launch (with the wall clock), find of a live runner (by runner.pid or its command line),
# and find of a job that had already ended (pid 0).
OLD_HANDLES = [
    '{"pid": 48213, "create_time": 1764201345.27, "job_dir": "/srv/cp/jobs/cp-01jf3k-a1", "launched_at": 1764201345.31}',
    '{"pid": 48213, "create_time": 1764201345.27, "job_dir": "/srv/cp/jobs/cp-01jf3k-a1"}',
    '{"pid": 0, "create_time": 0.0, "job_dir": "/srv/cp/jobs/cp-01jf3k-a2"}',
]


@pytest.mark.parametrize("stored", OLD_HANDLES)
def test_handles_stored_by_earlier_versions_decode_and_encode_unchanged(stored: str, tmp_path: Path) -> None:
    provider = LocalProvider.configured(tmp_path / "home")
    handle = provider.handle(json.loads(stored))
    assert isinstance(handle, LocalHandle) and handle.job_dir.startswith("/srv/cp/jobs/cp-01jf3k-a")
    assert json.dumps(handle.encode()) == stored  # what this version writes for the same job


def test_a_job_launched_by_an_earlier_version_is_still_watched(tmp_path: Path) -> None:
    """A row written before the upgrade: its runner is polled, its log read, and it is cancelled."""
    h = LocalHarness(tmp_path / "home")
    running = h.provider.launch(h.spec("cp-old-a1", SLEEP.format(s=30)))
    wait_for(h.provider, running, {JobPhase.RUNNING})
    old = {"pid": running.pid, "create_time": running.create_time, "job_dir": running.job_dir,
           "launched_at": running.launched_at}  # the dict the earlier launch returned
    restarted = LocalProvider.configured(tmp_path / "home", kill_grace_s=1.0)  # a new server, no memory of it
    handle = restarted.handle(json.loads(json.dumps(old)))
    assert poll_one(restarted, handle).phase == JobPhase.RUNNING
    assert any(ln.message == "sleeping" for ln in _eventually_lines(restarted, handle))
    restarted.cancel(handle)
    assert wait_for(restarted, handle, ENDED, timeout=30).phase == JobPhase.FAILED


def test_a_malformed_stored_handle_is_refused_clearly(tmp_path: Path) -> None:
    provider = LocalProvider.configured(tmp_path / "home")
    with pytest.raises(MalformedHandle, match=r"provider local: malformed LocalHandle .*job_dir: Field required"):
        provider.handle({"pid": 1, "create_time": 0.0})
    with pytest.raises(MalformedHandle, match="pid: Input should be a valid integer"):
        provider.handle({"pid": "the runner", "create_time": 0.0, "job_dir": "/x"})


def _eventually_lines(p: LocalProvider, handle: LocalHandle) -> list:  # type: ignore[type-arg]
    deadline = time.monotonic() + 10
    while True:
        lines = p.logs(handle, None, 100).lines
        if any(ln.message == "sleeping" for ln in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


# ---- release: what an expired task leaves behind ------------------------------------------------
def test_release_deletes_an_ended_jobs_directory_and_repeats_harmlessly(tmp_path: Path) -> None:
    h = LocalHarness(tmp_path / "home")
    spec = h.spec("cp-rel-a1", "open('scratch.bin', 'wb').write(b'x' * 4096); print('done')")
    handle = h.provider.launch(spec)
    assert wait_for(h.provider, handle, ENDED).phase == JobPhase.SUCCEEDED
    job_dir = Path(handle.job_dir)
    assert (job_dir / "console.log").exists() and (job_dir / "work" / "scratch.bin").stat().st_size == 4096
    deadline = time.monotonic() + 10
    while not h.provider.release(handle):  # the runner writes exit.json just before its process ends
        assert job_dir.is_dir() and time.monotonic() < deadline
        time.sleep(0.05)
    assert not job_dir.exists() and h.provider.jobs_dir.exists()
    assert h.provider.release(handle) is True  # again: nothing left, nothing fails
    assert h.provider.find(spec) is None  # the job is forgotten by the runner as well


def test_release_of_a_running_job_stops_nothing_and_deletes_nothing(tmp_path: Path) -> None:
    """A job whose task expired while it still runs (a stop that did not take) keeps its directory:
    its runner still writes there. release says False until the job has ended."""
    h = LocalHarness(tmp_path / "home")
    handle = h.provider.launch(h.spec("cp-busy-a1", SLEEP.format(s=30)))
    wait_for(h.provider, handle, {JobPhase.RUNNING})
    job_dir = Path(handle.job_dir)
    assert h.provider.release(handle) is False
    assert job_dir.is_dir() and psutil.pid_exists(handle.pid) and poll_one(h.provider, handle).phase == JobPhase.RUNNING
    h.provider.cancel(handle)
    wait_for(h.provider, handle, ENDED, timeout=30)
    deadline = time.monotonic() + 10
    while not h.provider.release(handle):
        assert job_dir.is_dir() and time.monotonic() < deadline
        time.sleep(0.05)
    assert not job_dir.exists()


def test_release_deletes_only_job_directories(tmp_path: Path) -> None:
    """A handle whose directory is not one of this provider's job directories deletes nothing."""
    h = LocalHarness(tmp_path / "home")
    precious = tmp_path / "precious"
    (precious / "work").mkdir(parents=True)
    (precious / "notes.txt").write_text("keep")
    assert h.provider.release(LocalHandle(pid=0, create_time=0.0, job_dir=str(precious))) is True
    assert (precious / "notes.txt").read_text() == "keep"


TOOL_WITH_CHILD = ("import subprocess, sys, time; "
                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)")


def _tool_group(handle: LocalHandle, timeout: float = 15) -> list[psutil.Process]:
    """The tool's process group (the tool and its child), once the runner has started both."""
    deadline = time.monotonic() + timeout
    while True:
        recorded = json.loads((Path(handle.job_dir) / "tool.pid").read_text()) \
            if (Path(handle.job_dir) / "tool.pid").exists() else None
        if recorded is not None:
            group = [p for p in psutil.process_iter() if _pgid(p.pid) == recorded["pgid"]]
            if len(group) == 2:
                return group
        assert time.monotonic() < deadline, "the tool and its child never both started"
        time.sleep(0.05)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_runner_killed_outright_leaves_no_tool_running(tmp_path: Path) -> None:
    """A runner killed with SIGKILL (or by the OOM killer) cannot stop its tool, which runs in a
    process group of its own. The provider reports the job gone only with nothing of it left:
    the tool and its child are killed, so a retry never runs beside the lost attempt (docs/design/errors-and-cancellation.md)."""
    h = LocalHarness(tmp_path / "home")
    handle = h.provider.launch(h.spec("cp-orphan-a1", TOOL_WITH_CHILD))
    group = _tool_group(handle)
    os.kill(handle.pid, signal.SIGKILL)
    assert wait_for(h.provider, handle, {JobPhase.GONE}, timeout=15).phase == JobPhase.GONE
    _gone, alive = psutil.wait_procs(group, timeout=10)
    assert alive == []


def test_a_recorded_group_whose_number_went_to_another_process_is_left_alone(tmp_path: Path) -> None:
    """The tool's pid is only a number once it is gone: a process that got it later (another start
    time) is not the tool's, and a lost job's clean-up does not touch it."""
    h = LocalHarness(tmp_path / "home")
    bystander = psutil.Popen(["sleep", "60"], start_new_session=True)
    try:
        job_dir = h.provider.jobs_dir / "cp-reused-a1"
        (job_dir / "work").mkdir(parents=True)
        (job_dir / "tool.pid").write_text(json.dumps({"pgid": bystander.pid, "started_at": time.time() - 3600}))
        handle = LocalHandle(pid=0, create_time=0.0, job_dir=str(job_dir))
        assert poll_one(h.provider, handle).phase == JobPhase.GONE
        h.provider.cancel(handle)
        assert bystander.is_running() and bystander.status() != psutil.STATUS_ZOMBIE
    finally:
        bystander.kill()
        bystander.wait(5)


# ---- the runner's claim (infra/runner/claim.py) ---------------------------------------------
def test_a_job_is_claimed_once_and_the_loser_learns_the_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first claim wins and leaves a complete file naming its pid; a second gets that pid.
    Where the file system has no hard links, an exclusive create does the same."""
    from controlplane_runner import claim

    path = str(tmp_path / "runner.pid")
    assert claim.claim(path) is None
    assert json.loads(Path(path).read_text())["pid"] == os.getpid()
    assert claim.claim(path) == os.getpid()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runner.pid"]  # no temporary file left

    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(claim.os, "link", no_links)
    other = str(tmp_path / "other.pid")
    assert claim.claim(other) is None and json.loads(Path(other).read_text())["pid"] == os.getpid()
    assert claim.claim(other) == os.getpid()
