"""The in-memory provider of the core tests (`tests/doubles.py`) keeps the provider contract, and
each of its levers does what it says: a launch refused for capacity, for a bad request or lost
after its job started, a job lost, a job listed late."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controlplane_providers.base import (
    CapacityProviderError,
    JobPhase,
    LaunchSpec,
    PermanentProviderError,
    ProviderOptions,
    TransientProviderError,
)
from tests.doubles import MemoryHandle, MemoryProvider
from tests.provider_contract import SLEEP, Harness, ProviderContract, poll_one, unique


class Groups(ProviderOptions):
    group: str = ""


class MemoryHarness(Harness):
    log_quota_setting = "log_reads_per_min"

    def __init__(self) -> None:
        self.provider = self.double = MemoryProvider("memory")
        self.capacity = self.faults = self.double  # start_jobs, fault_rate
        self.options = Groups()
        self._n = 0

    def spec(self, job_name: str, script: str, **kw: Any) -> LaunchSpec:
        # Alternate between two poll groups, as the clouds' harnesses alternate between two jobs.
        self._n += 1
        return replace(super().spec(job_name, script, **kw), options=Groups(group="a" if self._n % 2 else "b"))

    def count_jobs(self, job_name: str) -> int:
        return self.double.count(job_name)

    def forget(self, handle: MemoryHandle) -> None:  # type: ignore[override]
        self.double.lose(handle)

    def log_reads(self) -> int:
        return self.double.calls["log_reads"]


class TestMemoryContract(ProviderContract):
    @pytest.fixture
    def harness(self) -> MemoryHarness:
        return MemoryHarness()


@pytest.fixture
def harness() -> MemoryHarness:
    return MemoryHarness()


@pytest.mark.parametrize("error", [TransientProviderError("503"), CapacityProviderError("the region is full"),
                                   PermanentProviderError("no such job definition")])
def test_a_launch_told_to_fail_raises_and_starts_nothing(harness: MemoryHarness, error: Exception) -> None:
    p, spec = harness.double, harness.spec(unique("fail"), SLEEP.format(s=30))  # still running when polled
    p.fail_next_launch(error)  # type: ignore[arg-type]
    with pytest.raises(type(error)):
        p.launch(spec)
    assert p.find(spec) is None and p.count(spec.job_name) == 0
    assert poll_one(p, p.launch(spec)).phase == JobPhase.RUNNING  # the next launch runs


def test_a_launch_whose_answer_is_lost_started_its_job(harness: MemoryHarness) -> None:
    p, spec = harness.double, harness.spec(unique("lost"), SLEEP.format(s=30))
    p.fail_next_launch(TransientProviderError("502"), started=True)
    with pytest.raises(TransientProviderError):
        p.launch(spec)
    found = p.find(spec)
    assert found is not None and poll_one(p, found).phase == JobPhase.RUNNING and p.count(spec.job_name) == 1


def test_a_lost_job_is_gone_and_a_late_listing_finds_nothing_yet(harness: MemoryHarness) -> None:
    p = harness.double
    spec = harness.spec(unique("late"), SLEEP.format(s=30))
    p.list_lag_s = 60
    h = p.launch(spec)
    assert p.find(spec) is None and p.find_all(spec) == []  # launched, not listed yet
    p.list_lag_s = 0
    assert p.same_job(p.find(spec), h)  # type: ignore[arg-type]
    p.lose(h)
    assert poll_one(p, h).phase == JobPhase.GONE and p.find(spec) is None


def test_a_job_told_to_end_reports_its_exit_code(harness: MemoryHarness) -> None:
    p = harness.double
    h = p.start("cp-x-a1")
    assert poll_one(p, h).phase == JobPhase.RUNNING and p.release(h) is False
    p.end(h, 3)
    ended = poll_one(p, h)
    assert (ended.phase, ended.exit_code) == (JobPhase.FAILED, 3) and p.release(h) is True
