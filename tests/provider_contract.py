"""The provider contract suite: what every job runner must do, run against each provider's own
fake or emulator with the real in-job runner executing every job.

A provider's test module subclasses `ProviderContract` and gives it a `harness` fixture (a
`Harness`: the provider under test, plus the few levers only the fake has: keep jobs waiting,
make the runner forget a job, make a share of API calls fail, count the jobs of one attempt, name
the setting of the log read quota and count the log service's reads).
The suite then checks, through the provider's interface alone:

* launch runs the job to SUCCEEDED, or FAILED with the tool's non-zero exit;
* an ended job says when it started and ended (what its usage is counted from);
* the handle is the provider's own type, and what the database stores of it (JSON) decodes to
  the same handle, which polls, reads logs and cancels like the original;
* find after a crash between the launch intent and the handle finds the one job, and nothing
  for an attempt never launched;
* find_all lists both jobs of an attempt launched twice, newest first, where the runner keeps both;
* every phase: PENDING (no capacity), RUNNING, SUCCEEDED, FAILED, GONE, in one poll of
  handles of several poll groups, answered in order;
* cancel stops a running job, and repeating it (also after the end, and on a vanished job) is
  harmless;
* native logs read page by page return every line once, in order;
* log reads keep to the log service's read quota: a read over it answers at once with an empty
  page, a reason and its cursor unchanged, the service sees no more reads than the quota allows,
  and the tail goes on from that cursor once the quota has room, losing no line;
* throttled calls (429/5xx) are survived: nothing fails for them, and no attempt runs twice;
* release stops nothing (a running job keeps running) and is harmless to repeat once it ended;
* a provider that cannot reserve scratch disk says so, and refuses a launch that asks for it
  without starting anything.

Jobs run `python -c <script>` through the runner with no object store and no callback, so each
test stands alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from controlplane_providers import ratelimit
from controlplane_providers.base import (
    Capability,
    Handle,
    JobPhase,
    JobStatus,
    LaunchSpec,
    PermanentProviderError,
    Provider,
    ProviderOptions,
    TransientProviderError,
)

ENDED = {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.GONE}


class Harness:
    """What a provider's test module supplies. A lever the fake does not have is None (and the
    contract test that needs it is skipped with the reason)."""

    provider: Provider
    options: ProviderOptions
    capacity: Any = None  # an object whose `start_jobs = False` keeps new jobs waiting (the fake's executor)
    faults: Any = None  # an object whose `fault_rate` makes that share of API calls answer 429 or 5xx
    # The provider's setting for its log service's read quota (reads a minute), if it keeps one.
    log_quota_setting: str | None = None

    def count_jobs(self, job_name: str) -> int:
        """How many jobs the runner has for one attempt's job name."""
        raise NotImplementedError

    def forget(self, handle: Handle) -> None:
        """The runner no longer knows the job (purged from its history); its process dies."""
        raise NotImplementedError

    @contextmanager
    def pending(self) -> Iterator[None]:
        """Jobs launched inside wait for capacity until the block ends."""
        with _setting(self.capacity, "start_jobs", False):
            yield

    @contextmanager
    def failing_calls(self, rate: float) -> Iterator[None]:
        """A share of the provider's API calls answer 429 or 5xx inside the block."""
        with _setting(self.faults, "fault_rate", rate):
            yield

    def log_reads(self) -> int | None:
        """How many log reads the runner's log service has answered so far (None: not counted)."""
        return None

    @contextmanager
    def log_quota(self, reads: int) -> Iterator[None]:
        """The provider's log reads have a fresh quota of `reads` a minute inside the block, and
        a fresh default one after it."""
        settings = self.provider.settings  # type: ignore[attr-defined]
        quota = settings.model_copy(update={self.log_quota_setting: reads})
        self.provider.settings = quota  # type: ignore[attr-defined]
        ratelimit._registry.clear()  # the quota's limiter is made afresh on the next read
        try:
            yield
        finally:
            self.provider.settings = settings  # type: ignore[attr-defined]
            ratelimit._registry.clear()

    def spec(self, job_name: str, script: str, *, max_runtime_s: int = 120, scratch_mb: int = 0) -> LaunchSpec:
        return LaunchSpec(task_id="tsk_" + job_name, attempt=1, job_name=job_name, tool_name="contract", owner="me",
                          command=(self.provider.python, "-c", script), image=None,
                          env={"CONTROLPLANE_TASK_ID": "tsk_" + job_name, "CONTROLPLANE_ATTEMPT": "1",
                               "CONTROLPLANE_JOB_NAME": job_name},
                          cpu=1, memory_mb=512, gpu=0, scratch_mb=scratch_mb, max_runtime_s=max_runtime_s,
                          resource_class="contract", options=self.options)


def unique(prefix: str) -> str:
    return f"cp-{prefix}-{time.monotonic_ns() % 10**10}-a1"


def poll_one(provider: Provider, handle: Handle) -> JobStatus:
    [status] = provider.poll([handle])
    return status


def wait_for(provider: Provider, handle: Handle, phases: set[JobPhase], timeout: float = 60) -> JobStatus:
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = poll_one(provider, handle)
            if status.phase in phases:
                return status
        except TransientProviderError:
            status = None  # a throttled poll is no news
        if time.monotonic() > deadline:
            raise AssertionError(f"job still {status} after {timeout}s, wanted {phases}")
        time.sleep(0.1)


def eventually(fn: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (AssertionError, TransientProviderError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def launch_like_the_scheduler(provider: Provider, spec: LaunchSpec, tries: int = 30) -> Handle:
    """The scheduler's loop: after a launch that failed in an unknown way, find before retrying."""
    first = True
    for _ in range(tries):
        try:
            if not first:
                found = provider.find(spec)
                if found is not None:
                    return found
            first = False
            return provider.launch(spec)
        except TransientProviderError:
            time.sleep(0.1)
    raise AssertionError(f"could not launch {spec.job_name} in {tries} tries")


def still_watched(harness: Harness, restarted: Provider, earlier_form: Callable[[Handle], dict[str, Any]],
                  job_name: str = "cp-old-a1") -> tuple[Handle, JobStatus]:
    """A job launched by an earlier version: `earlier_form(handle)` is what that version stored
    for it. A restarted provider decodes that to the same handle, sees the job run, and stops it.
    Returns the handle and the job's final status (for the provider's own checks)."""
    launched = harness.provider.launch(harness.spec(job_name, SLEEP.format(s=30)))
    handle = restarted.handle(json.loads(json.dumps(earlier_form(launched))))
    assert handle == launched
    wait_for(restarted, handle, {JobPhase.RUNNING}, timeout=30)
    restarted.cancel(handle)
    return handle, wait_for(restarted, handle, ENDED, timeout=30)


PRINT_LINES = "import sys\nfor i in range({n}): print('line', i)\nsys.exit({code})"
SLEEP = "import time\nprint('sleeping', flush=True)\ntime.sleep({s})"


class ProviderContract:
    """Subclass with a `harness` fixture; every test below then runs against that provider."""

    def test_launch_runs_the_job_to_success_or_failure(self, harness: Harness) -> None:
        p = harness.provider
        ok = p.launch(harness.spec(unique("ok"), PRINT_LINES.format(n=2, code=0)))
        bad = p.launch(harness.spec(unique("bad"), PRINT_LINES.format(n=2, code=3)))
        assert wait_for(p, ok, ENDED).phase == JobPhase.SUCCEEDED
        failed = wait_for(p, bad, ENDED)
        assert failed.phase == JobPhase.FAILED
        assert failed.exit_code in (None, 3)  # not every runner reports the exit code

    def test_an_ended_job_reports_when_it_ran(self, harness: Harness) -> None:
        """What a job used is counted from these (`controlplane.prices`): the runner's own record
        of the job's start and end, within the time the test saw it exist."""
        p = harness.provider
        before = time.time()
        h = p.launch(harness.spec(unique("ran"), SLEEP.format(s=1.5)))
        ended = wait_for(p, h, ENDED)
        after = time.time()
        assert ended.phase == JobPhase.SUCCEEDED
        assert ended.started_at is not None and ended.finished_at is not None, ended
        # (a second of slack: some runners keep whole seconds, or their clock is the fake's)
        assert before - 1 <= ended.started_at <= ended.finished_at <= after + 1, (before, ended, after)
        assert ended.finished_at - ended.started_at >= 1.5 - 1, ended  # it slept 1.5 s in there

    def test_the_stored_handle_is_the_handle(self, harness: Harness) -> None:
        p = harness.provider
        spec = harness.spec(unique("json"), PRINT_LINES.format(n=3, code=0))
        h = p.launch(spec)
        assert type(h) is p.handle_type
        stored = json.dumps(h.encode())  # what jobs.handle_json holds
        again = p.handle(json.loads(stored))
        assert again == h and json.dumps(again.encode()) == stored
        assert wait_for(p, again, ENDED).phase == JobPhase.SUCCEEDED
        found = eventually(lambda: _found(p, spec))
        assert type(found) is p.handle_type and p.handle(json.loads(json.dumps(found.encode()))) == found
        p.cancel(again, "after the end")  # an ended job: nothing to stop

    def test_find_after_a_crash_between_intent_and_handle(self, harness: Harness) -> None:
        p = harness.provider
        spec = harness.spec(unique("find"), SLEEP.format(s=1))
        launched = p.launch(spec)  # ... and the control plane died before storing the handle
        found = eventually(lambda: _found(p, spec))
        assert wait_for(p, found, ENDED).phase == JobPhase.SUCCEEDED
        assert wait_for(p, launched, ENDED).phase == JobPhase.SUCCEEDED  # the same job
        assert harness.count_jobs(spec.job_name) == 1
        assert p.find(harness.spec(unique("never"), SLEEP.format(s=0))) is None

    def test_find_all_lists_every_execution_of_one_attempt(self, harness: Harness) -> None:
        """A paused leader wakes and launches the attempt its successor already launched: where
        the runner keeps both jobs, `find_all` answers both, newest first (`find`: the newest)."""
        p = harness.provider
        spec = harness.spec(unique("twice"), SLEEP.format(s=60))
        first = p.launch(spec)
        time.sleep(0.05)  # a later creation (and start) than the first's
        second = p.launch(spec)
        try:
            if harness.count_jobs(spec.job_name) < 2:
                pytest.skip(f"{p.name} keeps one job per attempt: a second launch adopts the first")
            wait_for(p, first, {JobPhase.RUNNING})  # (some runners order executions by their start)
            wait_for(p, second, {JobPhase.RUNNING})
            found = eventually(lambda: _all_found(p, spec, 2))
            assert p.same_job(found[0], second) and p.same_job(found[1], first), (found, second, first)
            assert not p.same_job(first, second)
            assert p.same_job(eventually(lambda: _found(p, spec)), second)
            assert p.find_all(harness.spec(unique("never"), SLEEP.format(s=0))) == []
        finally:
            for h in {json.dumps(h.encode()): h for h in (first, second)}.values():
                p.cancel(h, "contract")
        assert wait_for(p, first, ENDED).phase != JobPhase.RUNNING

    def test_every_phase_in_one_poll_in_order(self, harness: Harness) -> None:
        p = harness.provider
        running = p.launch(harness.spec(unique("run"), SLEEP.format(s=30)))
        done = p.launch(harness.spec(unique("done"), PRINT_LINES.format(n=1, code=0)))
        failed = p.launch(harness.spec(unique("fail"), PRINT_LINES.format(n=1, code=2)))
        gone = p.launch(harness.spec(unique("gone"), SLEEP.format(s=30)))
        wait_for(p, running, {JobPhase.RUNNING})
        wait_for(p, gone, {JobPhase.RUNNING})
        wait_for(p, done, ENDED)
        wait_for(p, failed, ENDED)
        harness.forget(gone)
        handles = [gone, done, running, failed]
        groups = {p.poll_key(h) for h in handles}
        statuses = eventually(lambda: _phases(p, handles, [JobPhase.GONE, JobPhase.SUCCEEDED, JobPhase.RUNNING,
                                                           JobPhase.FAILED]))
        assert statuses[2].started_at is not None and len(groups) >= 1
        p.cancel(running)
        wait_for(p, running, ENDED)

    def test_a_job_waiting_for_capacity_is_pending(self, harness: Harness) -> None:
        if harness.capacity is None:
            pytest.skip(f"{harness.provider.name} starts every job at once (no capacity to wait for)")
        p = harness.provider
        with harness.pending():
            h = p.launch(harness.spec(unique("pend"), PRINT_LINES.format(n=1, code=0)))
            assert poll_one(p, h).phase == JobPhase.PENDING
            p.cancel(h)  # cancel before it ever started
            assert wait_for(p, h, ENDED).phase in (JobPhase.FAILED, JobPhase.GONE)

    def test_cancel_stops_the_job_and_repeats_harmlessly(self, harness: Harness) -> None:
        p = harness.provider
        h = p.launch(harness.spec(unique("cancel"), SLEEP.format(s=120)))
        wait_for(p, h, {JobPhase.RUNNING})
        time.sleep(0.5)  # a job that has been running a moment (its runner has started)
        started = time.monotonic()
        for _ in range(3):
            p.cancel(h, "contract")
        status = wait_for(p, h, ENDED, timeout=60)
        assert status.phase in (JobPhase.FAILED, JobPhase.SUCCEEDED) and time.monotonic() - started < 60
        p.cancel(h, "again, after the end")
        harness.forget(h)
        p.cancel(h, "and once it is gone")

    def test_native_logs_page_by_page(self, harness: Harness) -> None:
        p = harness.provider
        h = p.launch(harness.spec(unique("logs"), PRINT_LINES.format(n=25, code=0)))
        wait_for(p, h, ENDED)

        def read_all() -> list[str]:
            seen: list[str] = []
            cursor = None
            for _ in range(40):
                page = p.logs(h, cursor, 7)
                assert len(page.lines) <= 7
                if not page.lines and page.reason is None:
                    break
                seen += [ln.message for ln in page.lines]
                cursor = page.next_cursor
            lines = [m for m in seen if m.startswith("line ")]
            assert lines == [f"line {i}" for i in range(25)], seen
            return lines

        eventually(read_all)

    def test_log_reads_keep_to_the_quota(self, harness: Harness) -> None:
        p = harness.provider
        if harness.log_quota_setting is None:
            pytest.skip(f"{p.name} keeps no log read quota of its own")
        h = p.launch(harness.spec(unique("quota"), PRINT_LINES.format(n=25, code=0)))
        wait_for(p, h, ENDED)
        eventually(lambda: _lines_from(p, h, None, 100, 25))  # every line has reached the log service
        seen: list[str] = []
        cursor = None
        with harness.log_quota(3):
            before = harness.log_reads()
            for _ in range(3):
                page = p.logs(h, cursor, 4)
                assert page.lines and page.reason is None, page
                seen += [ln.message for ln in page.lines]
                cursor = page.next_cursor
            for _ in range(2):  # over the quota: at once, nothing read, the tail stays where it was
                started = time.monotonic()
                over = p.logs(h, cursor, 4)
                assert time.monotonic() - started < 5
                assert over.lines == [] and over.reason and over.next_cursor == cursor, over
            if before is not None:
                assert harness.log_reads() - before <= 3  # the service saw no read over the quota
        seen += _lines_from(p, h, cursor, 100, 25 - len([m for m in seen if m.startswith("line ")]))
        assert [m for m in seen if m.startswith("line ")] == [f"line {i}" for i in range(25)], seen

    def test_release_stops_nothing_and_repeats_harmlessly(self, harness: Harness) -> None:
        p = harness.provider
        h = p.launch(harness.spec(unique("rel"), SLEEP.format(s=30)))
        wait_for(p, h, {JobPhase.RUNNING})
        p.release(h)  # the task has not expired: whatever it answers, the job runs on
        assert poll_one(p, h).phase == JobPhase.RUNNING
        p.cancel(h, "contract")
        wait_for(p, h, ENDED)
        assert eventually(lambda: _released(p, h)) is True
        assert p.release(h) is True  # again: nothing left

    def test_scratch_disk_is_refused_by_a_provider_that_cannot_reserve_it(self, harness: Harness) -> None:
        p = harness.provider
        if p.supports(Capability.SCRATCH):
            pytest.skip(f"{p.name} can guarantee scratch disk (tested with its own shapes)")
        spec = harness.spec(unique("scratch"), PRINT_LINES.format(n=1, code=0), scratch_mb=100)
        assert p.scratch_limit_mb(spec.shape) is None and p.scratch_note(spec.shape)
        with pytest.raises(PermanentProviderError, match="scratch_mb=100"):
            p.launch(spec)
        assert harness.count_jobs(spec.job_name) == 0 and p.find(spec) is None

    def test_throttled_calls_are_survived(self, harness: Harness) -> None:
        if harness.faults is None:
            pytest.skip(f"{harness.provider.name} calls no API that could throttle")
        p = harness.provider
        specs = [harness.spec(unique(f"thr{i}"), PRINT_LINES.format(n=1, code=0)) for i in range(3)]
        slow = harness.spec(unique("thrc"), SLEEP.format(s=60))
        with harness.failing_calls(0.3):
            handles = [launch_like_the_scheduler(p, s) for s in specs]
            slow_h = launch_like_the_scheduler(p, slow)
            for h in handles:
                assert wait_for(p, h, ENDED).phase == JobPhase.SUCCEEDED
            wait_for(p, slow_h, {JobPhase.RUNNING})
            eventually(lambda: p.cancel(slow_h))
            assert wait_for(p, slow_h, ENDED).phase in (JobPhase.FAILED, JobPhase.SUCCEEDED)
        for s in [*specs, slow]:
            assert harness.count_jobs(s.job_name) == 1, s.job_name


@contextmanager
def _setting(obj: Any, attr: str, value: Any) -> Iterator[None]:
    before = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, before)


def _found(p: Provider, spec: LaunchSpec) -> Handle:
    found = p.find(spec)
    assert found is not None, "find did not see the launched job"
    return found


def _all_found(p: Provider, spec: LaunchSpec, n: int) -> list[Handle]:
    found = p.find_all(spec)
    assert len(found) == n and all(type(h) is p.handle_type for h in found), found
    return found


def _lines_from(p: Provider, h: Handle, cursor: str | None, limit: int, want: int) -> list[str]:
    """The messages of one page from `cursor`, once it holds `want` lines of the script's."""
    page = p.logs(h, cursor, limit)
    messages = [ln.message for ln in page.lines]
    assert len([m for m in messages if m.startswith("line ")]) == want, page
    return messages


def _released(p: Provider, h: Handle) -> bool:
    assert p.release(h) is True
    return True


def _phases(p: Provider, handles: list[Handle], want: list[JobPhase]) -> list[JobStatus]:
    statuses = p.poll(handles)
    assert [s.phase for s in statuses] == want, statuses
    return statuses
