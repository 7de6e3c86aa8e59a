"""A provider double for the benchmarks: accepts every launch, says every job is running, and
counts the calls the control plane makes to it.

It stands in for a cloud provider whose API calls cost quota: the reconciler benchmark checks
that one cycle over N watched jobs makes at most ceil(N / poll_batch_size) poll calls. It never
starts a process, so the MCP latency benchmark can run a server whose in-flight tasks stay
in flight without anything else competing for the CPU.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from controlplane_providers.base import Handle, JobPhase, JobStatus, LaunchSpec, Provider, omitted_if_none


@dataclass(frozen=True)
class CountingHandle(Handle):
    """What `bench/seed.py` stores for the double's jobs."""

    job: str
    double: bool = True
    arn: str | None = omitted_if_none()


class CountingProvider(Provider[CountingHandle]):
    """Every job it knows is RUNNING, forever; `calls` counts API calls by method."""

    capabilities = frozenset()
    handle_type = CountingHandle

    def __init__(self, name: str = "local", *, poll_batch_size: int = 100, poll_interval_s: float = 1.0):
        self.name = name
        self.poll_batch_size = poll_batch_size
        self.poll_interval_s = poll_interval_s
        self.calls = {"launch": 0, "find": 0, "poll": 0, "cancel": 0}
        self._launched: set[str] = set()
        self.handles_polled = 0
        self.largest_batch = 0
        self._lock = threading.Lock()  # the control plane calls providers from worker threads
        self._started = time.time()

    def reset(self) -> None:
        with self._lock:
            self.calls = {k: 0 for k in self.calls}
            self.handles_polled = 0
            self.largest_batch = 0

    def launch(self, spec: LaunchSpec) -> CountingHandle:
        with self._lock:
            self.calls["launch"] += 1
            self._launched.add(spec.job_name)
        return CountingHandle(job=spec.job_name)

    def find(self, spec: LaunchSpec) -> CountingHandle | None:
        with self._lock:
            self.calls["find"] += 1
            launched = spec.job_name in self._launched
        return CountingHandle(job=spec.job_name) if launched else None

    def poll(self, handles: list[CountingHandle]) -> list[JobStatus]:
        with self._lock:
            self.calls["poll"] += 1
            self.handles_polled += len(handles)
            self.largest_batch = max(self.largest_batch, len(handles))
        status = JobStatus(JobPhase.RUNNING, started_at=self._started, raw_status="running")
        return [status] * len(handles)

    def cancel(self, handle: CountingHandle, reason: str = "cancelled") -> None:
        with self._lock:
            self.calls["cancel"] += 1
