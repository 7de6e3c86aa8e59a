"""The local provider: each job is the runner (`python -m controlplane_runner`) as a local process tree.

It runs the same job contract as the cloud providers, so everything works offline. Every job
gets a directory `<jobs_dir>/<job_name>/` (`CONTROLPLANE_LOCAL_JOBS_DIR`, default `<home>/jobs`):

    launch.json    what was launched          runner.pid   the runner's claim: {"pid", "claimed_at"}
    console.log    the runner's stdout/stderr (the tool's output, as a cloud console shows it);
                   its last lines go with the status of a job that ended without an outcome
                   (`JobStatus.last_output`), so a runner that died starting is not silent
    exit.json      the outcome, written by the runner as it exits
    work/          the job's scratch directory

A job starts once. A cloud API refuses a second job of one name; a directory does not, so the
runner makes the start single (`controlplane_runner.claim`): its first act is to create `runner.pid`,
which only one runner can, and a runner that finds it taken exits at once having done nothing.
`launch` waits for its runner's claim (the interpreter's start-up) and, when another runner holds
the job, returns that one. So a launcher paused between its look for the job and its start of a
runner (a leader stopped past its lease) wakes to adopt its successor's runner, not to run a second.

Runners are started in their own session, so they outlive a control plane that is killed and
are found again by their job directory (the claim, or a runner still starting by the `--job-name`
on its command line). Cancel sends SIGTERM to the runner, which stops the tool's process group;
if the runner has not exited after the grace period, a repeated cancel SIGKILLs the runner and
every process below it.

The handle (`LocalHandle`) is the runner's pid and process start time (a pid alone may be reused)
and the job directory.

`release(handle)` (when the task has expired) deletes the job directory, console log included.
It never stops a job: while the runner process lives it deletes nothing and answers False (the
control plane asks again later), because the runner still writes its console and `exit.json`
there and the tool works in `work/`. Releasing twice, or a directory already gone, is fine.

Scratch disk: refused. A local job writes to `work/` on this host's disk, which it shares with
everything else on the host; nothing reserves space for one job, so a task that asks for
`resources.scratch_mb` is refused at submit (and a launch that asks anyway is refused).

Settings (`CONTROLPLANE_LOCAL_*`): `PYTHON` (the interpreter runners and `{python}` tools run
with, which must have mcp-controlplane installed; default this one), `JOBS_DIR`, `POLL_INTERVAL_S`. No catalog options.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from pydantic_settings import SettingsConfigDict

from controlplane_providers.base import (
    Capability,
    Handle,
    JobPhase,
    JobStatus,
    LaunchSpec,
    LogLine,
    LogPage,
    PermanentProviderError,
    Provider,
    ProviderContext,
    ProviderSettings,
    Shape,
    omitted_if_none,
)
from controlplane_providers.jobdirs import (
    console_tail,
    create_time,
    is_job_dir,
    kill_remains,
    read_json,
    runner_of,
    runs_job,
    signal_group,
    write_json,
)
from controlplane_runner.claim import CLAIM_LOST

log = logging.getLogger("controlplane.providers.local")

CLAIM_WAIT_S = 30.0
NO_SCRATCH = ("local jobs write to this host's disk (the job directory's work/), shared with everything else on "
              "the host: nothing reserves scratch space for one job")


@dataclass(frozen=True)
class LocalHandle(Handle):
    """The runner process (pid and its start time: a pid alone may be reused) and its job directory.
    `pid` 0 is a job that ended before a restart found it (only `exit.json` was left)."""

    pid: int
    create_time: float
    job_dir: str
    # The wall clock at launch; absent from a handle that `find` rebuilt.
    launched_at: float | None = omitted_if_none()


class LocalSettings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_LOCAL_", extra="ignore")

    python: str | None = None  # default: the interpreter the control plane runs on
    jobs_dir: Path | None = None  # default: <home>/jobs
    poll_interval_s: float = 1.0


class LocalProvider(Provider[LocalHandle]):
    name = "local"
    Settings = LocalSettings
    handle_type = LocalHandle
    poll_batch_size = 1000
    capabilities = frozenset({Capability.LOGS})

    def __init__(self, settings: LocalSettings, context: ProviderContext):
        self.jobs_dir = Path(settings.jobs_dir or context.home / "jobs").resolve()  # runners start elsewhere
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.python = settings.python or sys.executable
        self.kill_grace_s = context.kill_grace_s
        self.poll_interval_s = settings.poll_interval_s
        self.endpoint_file = context.endpoint_file
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # ---- launch / find --------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> LocalHandle:
        if spec.scratch_mb:
            raise PermanentProviderError(f"scratch_mb={spec.scratch_mb}: {NO_SCRATCH}")
        job_dir = self.jobs_dir / spec.job_name
        (job_dir / "work").mkdir(parents=True, exist_ok=True)
        found = self.find(spec)
        if found is not None:
            return found
        # No runner holds the job (a directory without a claim is a launch that died, or one
        # still on its way: whichever runner claims first runs, the other exits at once).
        command = list(spec.command)
        write_json(job_dir / "launch.json", {"task_id": spec.task_id, "attempt": spec.attempt,
                                              "tool": spec.tool_name, "command": command})
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
        env.update(spec.env)
        # A runner that outlives this server finds its successor's callback URL here.
        env["CONTROLPLANE_ENDPOINT_FILE"] = str(self.endpoint_file)
        env["PYTHONUNBUFFERED"] = "1"
        argv = [self.python, "-m", "controlplane_runner", "--job-name", spec.job_name,
                "--claim-file", str(job_dir / "runner.pid"), "--workdir", str(job_dir / "work"),
                "--exit-file", str(job_dir / "exit.json"), "--tool-pid-file", str(job_dir / "tool.pid"),
                "--", *command]
        launched_at = time.time()
        with open(job_dir / "console.log", "ab") as console:
            child = subprocess.Popen(argv, cwd=job_dir, env=env, stdin=subprocess.DEVNULL, stdout=console,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._children[child.pid] = child
        mine = LocalHandle(pid=child.pid, create_time=create_time(child.pid), job_dir=str(job_dir),
                           launched_at=launched_at)
        if self._claimed(child, job_dir) or child.returncode != CLAIM_LOST:
            return mine  # ours (or it died starting: poll says it is gone)
        return self.find(spec) or mine  # another runner got there first: that one is the job

    def _claimed(self, child: subprocess.Popen[bytes], job_dir: Path) -> bool:
        """Wait until the runner claimed its job (True) or exited (False). Claiming is the first
        thing it does, so this is the interpreter's start-up, a few tens of milliseconds."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        while time.monotonic() < deadline:
            if (read_json(job_dir / "runner.pid") or {}).get("pid") == child.pid:
                return True
            if child.poll() is not None:
                return False
            time.sleep(0.002)
        return True  # still starting on a very busy host: treated as running, as before claims

    def find(self, spec: LaunchSpec) -> LocalHandle | None:
        """The job's runner: the one that claimed it (`runner.pid`), a runner still starting (by
        the `--job-name` on its command line), or the outcome a runner left (pid 0)."""
        job_dir = self.jobs_dir / spec.job_name
        if not job_dir.exists():
            return None
        claim = read_json(job_dir / "runner.pid") or {}
        claimed = claim.get("pid") if isinstance(claim.get("pid"), int) else None
        if claimed is not None:
            runner = runner_of(claimed, spec.job_name)
            if runner is not None:
                return LocalHandle(pid=runner.pid, create_time=runner.create_time(), job_dir=str(job_dir))
        else:
            for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
                if runs_job(p.info.get("cmdline") or [], spec.job_name):
                    return LocalHandle(pid=p.info["pid"], create_time=p.info["create_time"], job_dir=str(job_dir))
        if (job_dir / "exit.json").exists():
            return LocalHandle(pid=0, create_time=0.0, job_dir=str(job_dir))
        if claimed is not None:  # its runner died without an outcome: polled, it is gone (no second start)
            return LocalHandle(pid=claimed, create_time=0.0, job_dir=str(job_dir))
        return None

    def find_all(self, spec: LaunchSpec) -> list[LocalHandle]:
        """`find`'s one runner: one job directory per attempt, and a second runner started in it
        exits at once on the claim file the first holds (`launch` adopts the holder), so two
        runners of one attempt never both run here."""
        return super().find_all(spec)

    def same_job(self, a: LocalHandle, b: LocalHandle) -> bool:
        """One job directory is one job (`find` answers an ended job's with pid 0)."""
        return a.job_dir == b.job_dir

    # ---- poll -----------------------------------------------------------------------------
    def poll(self, handles: list[LocalHandle]) -> list[JobStatus]:
        return [self._status(h) for h in handles]

    def _status(self, h: LocalHandle) -> JobStatus:
        job_dir = Path(h.job_dir)
        outcome = read_json(job_dir / "exit.json")
        if outcome is None and self._alive(h):
            # psutil's create_time is derived from boot time and can be off by a second: the
            # wall clock at launch is the better start time.
            return JobStatus(JobPhase.RUNNING, started_at=h.launched_at, raw_status="running")
        if outcome is None:  # it may have finished between the two looks
            outcome = read_json(job_dir / "exit.json")
        if outcome is None:
            kill_remains(job_dir)  # gone means gone: no tool of a lost attempt runs beside its retry
            return JobStatus(JobPhase.GONE, reason="the runner process ended without reporting an outcome",
                             raw_status="gone", last_output=console_tail(job_dir / "console.log"))
        code = outcome.get("exit_code")
        ok = outcome.get("status") == "succeeded" and code == 0
        return JobStatus(
            JobPhase.SUCCEEDED if ok else JobPhase.FAILED,
            reason=outcome.get("error") or outcome.get("status"),
            exit_code=code,
            started_at=outcome.get("started_at"),
            finished_at=outcome.get("finished_at"),
            raw_status=str(outcome.get("status")),
            last_output=() if ok else console_tail(job_dir / "console.log"),
        )

    def _alive(self, h: LocalHandle) -> bool:
        pid = h.pid
        if pid <= 0:
            return False
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:  # reaps our own child
            self._children.pop(pid, None)
            return False
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - h.create_time) > 0.05:
                return False  # the pid was reused by another process
            return p.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    # ---- cancel ---------------------------------------------------------------------------
    def cancel(self, handle: LocalHandle, reason: str = "cancelled") -> None:
        if not self._alive(handle):
            kill_remains(Path(handle.job_dir))
            return
        job_dir = Path(handle.job_dir)
        marker = job_dir / "cancel_requested_at"
        try:
            first = float(marker.read_text())
        except (OSError, ValueError):
            first = time.time()
            marker.write_text(str(first))
        pid = handle.pid
        if time.time() - first < self.kill_grace_s + 5:
            signal_group(pid, signal.SIGTERM)  # the runner forwards it to the tool's group
            return
        # The runner did not finish stopping in time: kill it and everything below it.
        try:
            tree = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        groups = {pid}
        for p in tree:
            try:
                groups.add(os.getpgid(p.pid))
            except ProcessLookupError:
                pass
        for g in groups:
            signal_group(g, signal.SIGKILL)
        for p in tree:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    # ---- logs -----------------------------------------------------------------------------
    def logs(self, handle: LocalHandle, cursor: str | None, limit: int) -> LogPage:
        path = Path(handle.job_dir) / "console.log"
        try:
            offset = int(cursor or 0)
        except ValueError:
            offset = 0
        if not path.exists():
            return LogPage([], cursor, reason="the job has not written any output yet")
        lines: list[LogLine] = []
        with open(path, "rb") as f:
            f.seek(offset)
            while len(lines) < limit:
                raw = f.readline()
                if not raw or not raw.endswith(b"\n"):
                    break  # an unfinished last line waits for the next page
                offset += len(raw)
                lines.append(LogLine(ts=time.time(), message=raw.decode("utf-8", "replace").rstrip("\n")))
        return LogPage(lines, str(offset))

    # ---- release / scratch ----------------------------------------------------------------
    def release(self, handle: LocalHandle) -> bool:
        """Delete the job's directory, unless its runner still runs (then keep it: False)."""
        if self._alive(handle):
            return False
        job_dir = Path(handle.job_dir)
        if not job_dir.is_dir():
            return True
        if not is_job_dir(job_dir, self.jobs_dir):
            log.warning("not releasing %s: not a job directory of this provider", job_dir)
            return True
        shutil.rmtree(job_dir, ignore_errors=True)
        return not job_dir.exists()

    def scratch_note(self, shape: Shape) -> str:
        return NO_SCRATCH
