"""Moves: a step of the reconciler's cycle. An attempt whose launched job still waits to start
past its placement's patience (or that its provider reports stuck for room) goes to the tool's
next placement, without spending the retry budget, and never runs twice.

A move takes three steps, each recorded before the next, so that a restart anywhere finishes it
once (docs/design/placement.md, "Moves"):

1. the job's row says the move (`provider_status` "moving:<why>", the reason beside it);
2. the control plane takes the attempt's claim (`objectstore.claim`) with a nonce only it can
   make: a runner that starts from then on is refused the claim and runs nothing. If a runner
   holds the claim already, its job has started: the move is given up and the job runs;
3. the job is stopped until its provider says it ended (or, past `stop_confirm_timeout_s`, it
   is abandoned: it holds no claim, so it can run nothing), and only then does the attempt end
   `elsewhere` (`Attempts.end_elsewhere`), its job keeping the "no room" word the next choice
   of placement reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from controlplane.attempts import Attempts
from controlplane.catalog import Placed
from controlplane.ids import AttemptRef
from controlplane.objectstore.claim import take_claim
from controlplane.objectstore.registry import ObjectStores
from controlplane.ops import logs
from controlplane.outcomes import refusals_in_a_row
from controlplane.placement import NO_CAPACITY
from controlplane.reconciling.cycle import CycleStats
from controlplane.settings import Settings
from controlplane.states import JobState
from controlplane.store import Store
from controlplane.store.leases import Fence
from controlplane.store.rows import WatchedJob
from controlplane_providers.base import JobStatus, Provider

log = logging.getLogger("controlplane.reconciler")
MOVING = "moving:"  # a job's provider_status while its attempt moves ("moving:patience", "moving:stuck")


def moving(j: WatchedJob) -> str | None:
    """Why the watched job's attempt is moving ("patience", "stuck"), or None."""
    st = j.provider_status
    return st[len(MOVING):] if st is not None and st.startswith(MOVING) else None


class Moves:
    """Decides which waiting jobs move, and carries each move through; runs in the cycle's
    thread, its writes fenced by the cycle's fence."""

    def __init__(self, store: Store, providers: dict[str, Provider[Any]], object_stores: ObjectStores,
                 attempts: Attempts, settings: Settings, fence: Callable[[], Fence | None],
                 mover: Callable[[AttemptRef], str], send_stop: Callable[[WatchedJob, str, CycleStats], None],
                 sent_at: Callable[[WatchedJob], float]):
        self.store = store
        self.providers = providers
        self.object_stores = object_stores
        self.attempts = attempts
        self.settings = settings
        self.fence = fence  # the fence of the cycle under way
        self.mover = mover  # the digest of the control plane's own claim on an attempt
        self.send_stop = send_stop  # the reconciler's stop: recorded (fenced, with lease to spare), then sent
        self.sent_at = sent_at  # when the job's last stop was sent
        self._placements: dict[str, tuple[Placed, ...]] = {}  # waiting jobs' tools' placements, by job id
        self._seen: dict[str, tuple[Placed, ...]] = {}  # ... of the jobs seen this cycle
        self._claimed: set[str] = set()  # jobs whose attempt's claim this process holds
        self._several = True  # whether the catalog has a tool with several placements (per cycle)

    def begin_cycle(self) -> None:
        self._seen = {}
        # No tool with several placements: no waiting job is even looked at (no task is read).
        catalog = self.attempts.catalog
        self._several = any(len(catalog.placements(name)) > 1 for name in catalog.tools)

    def end_cycle(self) -> None:
        self._placements = self._seen

    # ---- which waiting job moves ----------------------------------------------------------------
    def due(self, j: WatchedJob, st: JobStatus, now: float) -> tuple[str, str] | None:
        """(why, reason) when the waiting job `j` (its task scheduled, its job pending) is to move:
        its tool has another placement and either its provider gave up on the job, or reports it
        stuck and stuck means no room (AWS Batch), or it has waited past its placement's
        patience. None: it keeps waiting (a tool's only placement always does)."""
        if not self._several:
            return None
        placements = self._placements_of(j)
        if len(placements) < 2:
            return None
        placed = placements[j.placement] if 0 <= j.placement < len(placements) else None
        provider = self.providers.get(j.provider)
        if st.give_up_reason:
            return "stuck", st.give_up_reason
        if placed is not None and placed.patience_s is not None:
            waited = now - (j.launched_at or j.created_at)
            if waited >= placed.patience_s:
                said = st.waiting_reason or st.reason
                return "patience", (f"the job waited {waited:.0f} s to start, past the placement's patience "
                                    f"({placed.patience_s:g} s)" + (f": {said}" if said else ""))
        elif provider is not None and provider.stuck_is_no_room and st.waiting_reason:
            return "stuck", f"the job did not start: {st.waiting_reason}"
        return None

    def _placements_of(self, j: WatchedJob) -> tuple[Placed, ...]:
        placements = self._placements.get(j.job_id)
        if placements is None:
            task = self.store.tasks.get(j.task_id)
            placements = self.attempts.catalog.placements_at(task.tool_name, task.submitted_at) if task else ()
        self._seen[j.job_id] = placements
        return placements

    # ---- a move, step by step -----------------------------------------------------------------
    def begin(self, j: WatchedJob, why: str, reason: str, now: float, stats: CycleStats) -> None:
        """Record the move on the job's row, then go on with it."""
        if not self.store.jobs.begin_move(j.job_id, MOVING + why, reason, self.fence()):
            return
        log.warning("job %s of task %s attempt %d: %s; moving it to the next placement", j.job_name, j.task_id,
                    j.attempt, reason, extra=logs.of_job(j, "moving", reason=why))
        self.step(j.with_provider_status(MOVING + why, reason), True, now, stats)

    def step(self, j: WatchedJob, alive: bool, now: float, stats: CycleStats) -> None:
        """A moving job, as its provider said it is now (`alive`): the attempt's claim taken
        (once per process; a runner's claim gives the move up), the job stopped until it ended,
        then the attempt ended elsewhere."""
        why = moving(j) or "patience"
        if j.job_id not in self._claimed:
            if not self._claim(j):
                return
            self._claimed.add(j.job_id)
        if not alive:
            self._end(j, why, JobState.DONE)
        elif j.stop_requested_at is not None and now - j.stop_requested_at >= self.settings.stop_confirm_timeout_s:
            log.warning("job %s did not confirm it stopped; it holds no claim and can run nothing: abandoned, "
                        "its attempt moves", j.job_name, extra=logs.of_job(j, "abandoned"))
            self._end(j, why, JobState.ABANDONED)
        elif now - self.sent_at(j) >= 5.0:
            self.send_stop(j, "moving to another placement", stats)

    def _claim(self, j: WatchedJob) -> bool:
        """Take the attempt's claim for the control plane. False: not now (the store did not
        answer), or never (a runner holds it: the move is given up, and the job runs)."""
        task = self.store.tasks.get(j.task_id)
        if task is None:
            return False
        mine = self.mover(j.ref)
        try:
            holder = take_claim(self.object_stores.get(task.store_url), j.ref, mine, by="control-plane")
        except OSError as e:
            log.warning("the claim of %s could not be taken for its move: %s", j.job_name, type(e).__name__,
                        extra=logs.of_job(j, "move_claim_failed"))
            return False
        if holder != mine:
            log.warning("job %s started before it could move: it runs where it is", j.job_name,
                        extra=logs.of_job(j, "move_given_up"))
            self.store.jobs.cancel_move(j.job_id, self.fence())
            return False
        return True

    def _end(self, j: WatchedJob, why: str, job_state: JobState) -> None:
        earlier = [x for x in self.store.jobs.of_task(j.task_id) if x.attempt < j.attempt]
        moved = self.attempts.end_elsewhere(j.ref, NO_CAPACITY, j.provider_reason or "no room",
                                            refusals=refusals_in_a_row(earlier, NO_CAPACITY),
                                            placements=max(2, len(self._placements_of(j))), why=why,
                                            job_state=job_state)
        self._claimed.discard(j.job_id)
        if moved:
            log.warning("task %s attempt %d moved off %s (placement %d): %s", j.task_id, j.attempt, j.provider,
                        j.placement, j.provider_reason, extra=logs.of_job(j, "moved", reason=why))
