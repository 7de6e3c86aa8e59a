"""Where an attempt runs: one of its tool's placements, chosen when the attempt is claimed
(`JobStore.claim_for_launch` asks the scheduler's `Placer`) and kept on its job (`provider`,
`placement`), so that every later read of the attempt (its launch, status, logs, result, cost,
release) goes where it ran. docs/design/placement.md says why the choice is made here."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controlplane.catalog import Catalog, Placed
from controlplane.store.rows import JobRow, TaskRow

# A job's provider_status when its placement refused it for room (CapacityProviderError).
NO_CAPACITY = "no_capacity"


def choose(placements: Sequence[Placed], previous: Callable[[], Sequence[JobRow]]) -> int:
    """The index of the placement a task's next attempt runs on. With one placement, that one
    (`previous`, the task's earlier attempts' jobs, is not read). Else where the last attempt
    ran, or the next one after it (in the catalog's order, round) when that placement refused
    the last attempt for capacity; the first for a first attempt."""
    if len(placements) <= 1:
        return 0
    jobs = previous()
    if not jobs:
        return 0
    last = jobs[-1]
    here = last.placement if 0 <= last.placement < len(placements) else 0
    return (here + 1) % len(placements) if last.provider_status == NO_CAPACITY else here


class Placer:
    """The scheduler's choice of placement for a claimed task, from the catalog."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def placements(self, task: TaskRow) -> tuple[Placed, ...]:
        """The task's tool's placements as it was admitted (empty when this process never knew it)."""
        return self.catalog.placements_at(task.tool_name, task.submitted_at)

    def __call__(self, task: TaskRow, previous: Callable[[], Sequence[JobRow]]) -> tuple[str, int]:
        """(provider, index in the tool's placements) of the task's next attempt."""
        placements = self.placements(task)
        if not placements:  # its launch is refused (`ControlPlane.build_spec`)
            return task.provider, 0
        i = choose(placements, previous)
        return placements[i].provider, i
