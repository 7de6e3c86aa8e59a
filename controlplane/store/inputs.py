"""Inputs by reference: the `task_inputs` rows of a task whose inputs name files
(`controlplane.references`), written in its submit's transaction and read by the launch (what the
runner fetches) and by retention (what must stay). Persistence only."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from controlplane.store import queries as q
from controlplane.store.db import Database

ARTIFACT = re.compile(r"^artifact://(tsk_[0-9A-Za-z_-]{1,60})/(.+)$")  # task id, name in the task


def artifact_parts(ref: str) -> tuple[str, str] | None:
    """(task id, artifact name) of an `artifact://` reference, or None."""
    m = ARTIFACT.match(ref)
    return (m.group(1), m.group(2)) if m else None


@dataclass(frozen=True, slots=True)
class InputRow:
    """One file field of a task's inputs: the reference as written (`ref`), and where its bytes
    are (`store_url`, `storage_key`), with the size and sha256 they must have. A reference to an
    artifact of a parent that has not ended yet is recorded unresolved (`storage_key` '')."""

    field: str
    kind: str  # "upload" | "artifact" | "url"
    ref: str
    store_url: str
    storage_key: str
    size_bytes: int | None
    sha256: str | None
    task_id: str = ""

    @property
    def resolved(self) -> bool:
        return self.storage_key != ""

    @classmethod
    def from_row(cls, r: Any) -> InputRow:
        return cls(**{k: r[k] for k in ("field", "kind", "ref", "store_url", "storage_key", "size_bytes",
                                        "sha256", "task_id")})


def add(c: Any, task_id: str, rows: Sequence[InputRow]) -> None:
    """The task's references (one statement)."""
    if rows:
        c.execute(q.INSERT_TASK_INPUT, [{**asdict(r), "task_id": task_id} for r in rows])


def of(db: Database, task_id: str) -> list[InputRow]:
    """The task's references, by field."""
    return [InputRow.from_row(r) for r in db.fetch(q.TASK_INPUTS, {"task_id": task_id})]


def of_in(db: Database, c: Any, task_id: str) -> list[InputRow]:
    """`of`, inside the caller's transaction."""
    return [InputRow.from_row(r) for r in db.rows(c, q.TASK_INPUTS, {"task_id": task_id})]


def resolve(db: Database, c: Any, task_id: str, row: InputRow) -> None:
    """Record where an unresolved reference's bytes turned out to be."""
    db.run(c, q.RESOLVE_TASK_INPUT, {"_task_id": task_id, "_field": row.field, "_store_url": row.store_url,
                                     "_storage_key": row.storage_key, "_size": row.size_bytes,
                                     "_sha256": row.sha256})


@dataclass(frozen=True, slots=True)
class Resolution:
    """A task's references once its unresolved ones were looked up: `missing` the (parent, name)
    of the first artifact not registered (None: all found), `rows` every reference as now
    recorded, `late` the fields resolved just now."""

    missing: tuple[str, str] | None
    rows: tuple[InputRow, ...]
    late: tuple[str, ...]


def lookup(db: Database, c: Any, rows: Sequence[InputRow]) -> Resolution:
    """`rows` with each unresolved one looked up among the artifacts registered now, in the
    caller's transaction, writing nothing; it stops at the first missing one."""
    out, late = [], []
    for row in rows:
        if row.resolved:
            out.append(row)
            continue
        parts = artifact_parts(row.ref)
        assert parts is not None
        found = [r for r in db.rows(c, q.ARTIFACTS, {"task_id": parts[0]}) if r["name"] == parts[1]]
        if not found:
            return Resolution(parts, (), ())
        art = max(found, key=lambda r: r["attempt"])
        out.append(InputRow(field=row.field, kind=row.kind, ref=row.ref, store_url=art["store_url"],
                            storage_key=art["storage_key"], size_bytes=art["size_bytes"], sha256=art["sha256"],
                            task_id=row.task_id))
        late.append(row.field)
    return Resolution(None, tuple(out), tuple(late))


def resolve_artifacts(db: Database, c: Any, task_id: str) -> Resolution:
    """The task's unresolved references (artifacts of parents that had not ended when it was
    submitted) resolved from the artifacts now registered (`lookup`), and recorded, in the
    caller's transaction."""
    found = lookup(db, c, of_in(db, c, task_id))
    for row in found.rows:
        if row.field in found.late:
            resolve(db, c, task_id, row)
    return found


def held(db: Database, ref: str) -> bool:
    """Whether a task that can still run refers to `ref`."""
    return bool(db.fetch(q.REF_HELD, {"ref": ref}))


def artifacts_held(db: Database, task_id: str) -> bool:
    """Whether a task that can still run refers to an artifact of `task_id`."""
    return bool(db.fetch(q.ARTIFACT_HELD, {"task_id": task_id}))
