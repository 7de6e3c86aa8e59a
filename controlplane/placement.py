"""Where an attempt runs: one of its tool's placements, chosen when the attempt is claimed
(`JobStore.claim_for_launch` asks the scheduler's `Placer`) and kept on its job (`provider`,
`placement`), so that every later read of the attempt (its launch, status, logs, result, cost,
release) goes where it ran. docs/design/placement.md says why the choice is made here, and how."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from controlplane.breakers import Breakers, site
from controlplane.catalog import Catalog, Placed
from controlplane.catalog_models import PlacementPolicy
from controlplane.store.rows import JobRow, TaskRow

if TYPE_CHECKING:
    from controlplane.prices import Pricing
    from controlplane_providers.base import Provider

# A job's provider_status when its placement refused it for capacity (CapacityProviderError).
NO_CAPACITY = "no_capacity"

# How many of a tool's jobs not ended are at its placement (tool name, index): the store's count.
Busy = Callable[[str, int], int]


def _never(_i: int) -> bool:
    return False


def order(n: int, policy: PlacementPolicy = "ordered", costs: Sequence[float | None] = ()) -> list[int]:
    """The placements' indices in the policy's order: the catalog's, or by estimated cost (the
    lowest first, ties in the catalog's order, an unknown cost last)."""
    if policy != "cheapest" or len(costs) != n:
        return list(range(n))
    return sorted(range(n), key=lambda i: (costs[i] is None, costs[i] or 0.0, i))


def choose(placements: Sequence[Placed], previous: Callable[[], Sequence[JobRow]], *,
           policy: PlacementPolicy = "ordered", costs: Sequence[float | None] = (),
           blocked: Callable[[int], bool] = _never, full: Callable[[int], bool] = _never) -> int | None:
    """The index of the placement a task's next attempt runs on, or None: none can take it now
    (the task stays queued). The placements are taken in the policy's order (`order`), starting
    where the task's last attempt ran, or at the next one (round the list) when that placement
    refused it for capacity, at the first for a first attempt; the first one whose breaker admits
    it (`blocked` False) and that has a free slot (`full` False) is chosen.

    With one placement, that one unless it is `full`: its breaker is not asked (there is nowhere
    else to go) and `previous`, the task's earlier attempts' jobs, is not read."""
    n = len(placements)
    if n <= 1:
        return None if n and full(0) else 0
    ranked = order(n, policy, costs)
    start = 0
    jobs = previous()
    if jobs:
        last = jobs[-1]
        here = last.placement if 0 <= last.placement < n else 0
        start = ranked.index(here) + (1 if last.provider_status == NO_CAPACITY else 0)
    for k in range(n):
        i = ranked[(start + k) % n]
        if not blocked(i) and not full(i):
            return i
    return None


class Placer:
    """The scheduler's choice of placement for a claimed task: its tool's placements (as it was
    admitted), the policy, the breakers of their sites and, for `cheapest`, their prices."""

    def __init__(self, catalog: Catalog, breakers: Breakers | None = None,
                 providers: dict[str, Provider[Any]] | None = None, pricing: Pricing | None = None):
        self.catalog = catalog
        self.breakers = breakers or Breakers()
        self.providers = providers or {}
        self.pricing = pricing
        self._sites: dict[int, tuple[tuple[Placed, ...], tuple[str, ...]]] = {}
        self._skipping: tuple[object, frozenset[str]] = (None, frozenset())  # (tools, classes): may_skip's
        # (placements, class, resources) -> (placements, their costs): tasks of one shape share them
        self._priced: dict[tuple[int, str, str], tuple[tuple[Placed, ...], list[float | None]]] = {}

    def placements(self, task: TaskRow) -> tuple[Placed, ...]:
        """The task's tool's placements as it was admitted (empty when this process never knew it)."""
        return self.catalog.placements_at(task.tool_name, task.submitted_at)

    def site(self, provider: str, options: Any) -> str:
        """The breaker key of a placement: its provider and the region its jobs run in."""
        p = self.providers.get(provider)
        try:
            region = p.price_region(options) if p is not None else None
        except Exception:  # noqa: BLE001 - options it cannot place: the provider's site alone
            region = None
        return site(provider, region)

    def sites(self, placements: tuple[Placed, ...]) -> tuple[str, ...]:
        """Each placement's breaker key (kept per placements tuple: a catalog's are made once)."""
        kept = self._sites.get(id(placements))
        if kept is None or kept[0] is not placements:
            kept = (placements, tuple(self.site(p.provider, p.options) for p in placements))
            self._sites[id(placements)] = kept
        return kept[1]

    def may_skip(self, resource_class: str) -> bool:
        """Whether a task of the class may be left queued by the choice (a tool with several
        placements, or a `max_running`): the claim then looks further down the queue."""
        tools = self.catalog.tools
        if self._skipping[0] is not tools:  # once per catalog
            self._skipping = (tools, frozenset(
                t.resource_class for name, t in tools.items() for p in [self.catalog.placements(name)]
                if p and (len(p) > 1 or p[0].max_running is not None)))
        return resource_class in self._skipping[1]

    def __call__(self, task: TaskRow, previous: Callable[[], Sequence[JobRow]],
                 busy: Busy | None = None) -> tuple[str, int] | None:
        """(provider, index in the tool's placements) of the task's next attempt; None: none has
        room or admits it now (`busy` counts a placement's jobs, asked only for a `max_running`)."""
        return self._choose(task, previous, busy, probe=True)

    def peek(self, task: TaskRow, previous: Callable[[], Sequence[JobRow]],
             busy: Busy | None = None) -> tuple[str, int] | None:
        """What the choice would be now, as `__call__`, but chosen by no one: a half-open
        breaker's probe is not spent on it."""
        return self._choose(task, previous, busy, probe=False)

    def _choose(self, task: TaskRow, previous: Callable[[], Sequence[JobRow]], busy: Busy | None,
                probe: bool) -> tuple[str, int] | None:
        placements = self.placements(task)
        if not placements:  # its launch is refused (`ControlPlane.build_spec`)
            return task.provider, 0

        def full(i: int) -> bool:
            cap = placements[i].max_running
            return cap is not None and busy is not None and busy(task.tool_name, i) >= cap

        if len(placements) == 1:
            return None if full(0) else (placements[0].provider, 0)
        keys = self.sites(placements)
        policy = self._policy(task, placements)
        costs = self._costs(task, placements) if policy == "cheapest" else ()
        if task.attempt <= 1:  # a first attempt has no earlier jobs: not read
            previous = tuple
        i = choose(placements, previous, policy=policy, costs=costs,
                   blocked=lambda j: not self.breakers.admits(keys[j]), full=full)
        if i is None:
            return None
        if probe:
            self.breakers.chose(keys[i])
        return placements[i].provider, i

    def _policy(self, task: TaskRow, placements: tuple[Placed, ...]) -> PlacementPolicy:
        """The tool's policy, else its class's: the current ones while the task's placements are
        the current tool's (two lookups), else as the task was admitted."""
        tool = self.catalog.tools.get(task.tool_name)
        rc = self.catalog.resource_classes.get(task.resource_class)
        if tool is None or rc is None or self.catalog.placements(task.tool_name) is not placements:
            try:
                d = self.catalog.admitted(task.tool_name, task.resource_class, task.submitted_at)
            except LookupError:
                return "ordered"
            tool, rc = d.tool, d.resource_class
        return tool.placement_policy or rc.placement_policy

    def _costs(self, task: TaskRow, placements: tuple[Placed, ...]) -> list[float | None]:
        """Each placement's estimated cost of the task: its shape for the tool's estimate, at the
        placement's rate in the price table (None: no price known)."""
        if self.pricing is None:
            return [None] * len(placements)
        key = (id(placements), task.resource_class, task.resources_json or "{}")
        kept = self._priced.get(key)
        if kept is not None and kept[0] is placements:
            return kept[1]
        tool = self.catalog.tool(task.tool_name)
        runtime = tool.estimate_s if tool is not None and tool.estimate_s > 0 else 1.0
        resources = json.loads(task.resources_json or "{}")
        costs = [self.pricing.estimate(self.pricing.at(p.provider, task.resource_class, resources, p.options), runtime)
                 for p in placements]
        if len(self._priced) >= 4096:  # many shapes: start again rather than grow
            self._priced.clear()
        self._priced[key] = (placements, costs)
        return costs
