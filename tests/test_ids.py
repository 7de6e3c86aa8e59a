"""Task ids: opaque and unguessable, and in the order they were made (so that every index keyed by
a task id takes new rows at its end: issue 13)."""

from __future__ import annotations

import random
import re
import time

from controlplane import ids

TASK_ID = re.compile(r"tsk_[a-z2-7]{26}")
JOB_NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")


def test_task_ids_keep_their_format_and_make_valid_job_names() -> None:
    for _ in range(1000):
        tid = ids.new_task_id()
        assert TASK_ID.fullmatch(tid), tid
        assert JOB_NAME.fullmatch(ids.AttemptRef(tid, 12).job_name), ids.AttemptRef(tid, 12).job_name


def test_task_ids_sort_in_the_order_they_were_made() -> None:
    rng = random.Random(5)
    times = sorted({0, 1, 31, 32, 33, 1023, 1024, 2**47, 2**48 - 1, *(rng.randrange(2**48) for _ in range(2000))})
    made = [ids.new_task_id(t) for t in times]
    assert sorted(made) == made
    first = ids.new_task_id()
    time.sleep(0.003)
    assert ids.new_task_id() > first


def test_ids_made_in_the_same_millisecond_are_distinct_and_unguessable() -> None:
    same = [ids.new_task_id(1_700_000_000_000) for _ in range(20_000)]
    assert len(set(same)) == len(same)
    tails = [t[-16:] for t in same]  # 80 random bits each: no character position is predictable
    for pos in range(16):
        assert len({t[pos] for t in tails}) == 32
