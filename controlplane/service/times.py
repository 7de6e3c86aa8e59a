"""The time filters of list_tasks and usage_report as epoch seconds."""

from __future__ import annotations

from datetime import UTC, datetime

# The times an answer can write (years 1 to 9999, UTC): a filter time beyond them (a zone offset
# can carry a valid date past either end) means the same as the end itself, as no task lies there.
EARLIEST = datetime(1, 1, 1, tzinfo=UTC).timestamp()
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def epoch(when: datetime | None) -> float | None:
    """A filter time as epoch seconds, within [EARLIEST, LATEST]; a time without a zone is UTC."""
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds(), EARLIEST), LATEST)
