"""Conflicts: a write transaction PostgreSQL aborted to let another go on (deadlock_detected,
serialization_failure), and the reruns of a whole unit of work that hit one.

A unit is a call that opens its own write transaction(s) and is safe to run again from the
start: the failed transaction was rolled back, the ones it committed before are idempotent.
Never a call inside an open transaction: an aborted transaction can do nothing but roll back,
so only its opener can try again (`rerun_on_conflict` on a method called inside one runs it
once; the enclosing unit's rerun, if any, covers it). docs/design/guards.md#lock-order says
which cycles are left; SQLite serialises writers and never raises these.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy.exc import DBAPIError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

log = logging.getLogger("controlplane.store.conflicts")

T = TypeVar("T")
P = ParamSpec("P")
CONFLICTS = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure
ATTEMPTS = 4  # the first run and three reruns


def is_conflict(exc: BaseException) -> bool:
    """Whether `exc` is PostgreSQL aborting a transaction for another's sake (sqlstate 40P01 or
    40001): the same unit run again may well commit. Any other error (a constraint violated,
    the server gone) is not, and neither is anything SQLite raises."""
    return isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) in CONFLICTS


def rerun(unit: Callable[[], T], what: str) -> T:
    """`unit()`, run again (up to ATTEMPTS runs in all, a few tens of ms apart, randomised) while
    it fails with a conflict; the last conflict, or any other error, is raised. Each rerun is
    logged at WARNING with `what` and the sqlstate only."""
    retrying = Retrying(retry=retry_if_exception(is_conflict), stop=stop_after_attempt(ATTEMPTS),
                        wait=wait_random_exponential(multiplier=0.02, max=0.5), reraise=True,
                        before_sleep=lambda state: _note(state, what))
    return retrying(unit)


def _note(state: RetryCallState, what: str) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    code = getattr(getattr(exc, "orig", None), "sqlstate", None)
    log.warning("%s: the database aborted its transaction for another's (sqlstate %s); run %d of %d next",
                what, code, state.attempt_number + 1, ATTEMPTS,
                extra={"event": "write_conflict", "sqlstate": code, "attempt": state.attempt_number})


class _Writes(Protocol):
    def in_tx(self) -> bool: ...


class _Aggregate(Protocol):
    @property
    def w(self) -> _Writes: ...


A = TypeVar("A", bound=_Aggregate)


def rerun_on_conflict(method: Callable[Concatenate[A, P], T]) -> Callable[Concatenate[A, P], T]:
    """A store method that is a whole unit (it opens its own write transactions), `rerun` on a
    conflict; called inside an open transaction of its writer's (`Writer.in_tx`), run once."""
    what = method.__qualname__

    @functools.wraps(method)
    def run(self: A, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self.w.in_tx():
            return method(self, *args, **kwargs)
        return rerun(lambda: method(self, *args, **kwargs), what)

    return run
