"""Opaque, unguessable identifiers and the job names derived from them.

Artifact and job ids carry 128 random bits. A task id is a millisecond clock followed by 80
random bits, the layout of a ULID or a UUIDv7, in the same 26 characters of lowercase base32:
a new task's id then sorts after every older one, so each index keyed by it (the tasks' own, their
events', logs' and jobs') takes new rows at its right-hand end, as it does for an integer key,
instead of on a random page (docs/design/hot-path.md). What an id tells its holder beyond the task is when it was
submitted, which the task's status says anyway; 80 random bits still make one unguessable from
another (ids are no capability either: every read checks the caller).

Job names are a pure function of the attempt (`AttemptRef`: task id, attempt, shard): a control plane that restarts finds what it
launched by name, and a name is valid for every provider (lowercase letters, digits and '-',
starting with a letter, at most 63 characters).
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

# Base32's own digits in ASCII order, so that the clock's digits sort as the clock does (base32's
# alphabet puts 2-7 after the letters); the ids keep base32's characters throughout.
_SORTED_B32 = "234567abcdefghijklmnopqrstuvwxyz"


def _random_token(nbytes: int = 16) -> str:
    return base64.b32encode(secrets.token_bytes(nbytes)).decode().rstrip("=").lower()


def _clock(ms: int) -> str:
    """`ms` (48 bits: until the year 10889) as 10 base32 digits, most significant first."""
    return "".join(_SORTED_B32[(ms >> shift) & 31] for shift in range(45, -5, -5))


def new_task_id(now_ms: int | None = None) -> str:
    """`tsk_` + 10 characters of clock (ms since the epoch) + 16 of randomness (80 bits)."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return "tsk_" + _clock(ms) + _random_token(10)


def new_sweep_id(now_ms: int | None = None) -> str:
    """`swp_` + a task id's clock and randomness: a sweep's id sorts as its submit time does."""
    return "swp_" + new_task_id(now_ms).removeprefix("tsk_")


def new_artifact_id() -> str:
    return "art_" + _random_token()


def new_job_id() -> str:
    return "job_" + _random_token()


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """One attempt of one task (and, for a task run as shards, one shard of it). Its job name,
    credentials' messages, route path and runner environment derive from it here, its object-store
    keys in `controlplane.objectstore.base`. With `shard` None each is the string the control plane
    has always made, so jobs and objects of an older deployment still match."""

    task_id: str
    number: int
    shard: int | None = None

    @property
    def job_name(self) -> str:
        """`cp-<token>-a<attempt>[-s<shard>]`: deterministic, so a restart can look the job up."""
        shard = "" if self.shard is None else f"-s{int(self.shard)}"
        return f"cp-{self.task_id.removeprefix('tsk_')}-a{int(self.number)}{shard}"

    @property
    def path(self) -> str:
        """`tasks/<task id>/attempts/<attempt>[/shards/<shard>]`: the runner routes' path part."""
        shard = "" if self.shard is None else f"/shards/{int(self.shard)}"
        return f"tasks/{self.task_id}/attempts/{int(self.number)}{shard}"

    def message(self, purpose: str) -> bytes:
        """What this attempt's credential for `purpose` is an HMAC of."""
        shard = "" if self.shard is None else f"\n{int(self.shard)}"
        return f"controlplane/{purpose}\n{self.task_id}\n{int(self.number)}{shard}".encode()

    def to_env(self) -> dict[str, str]:
        """The runner's environment variables that name this attempt (`from_env` reads them)."""
        env = {"CONTROLPLANE_TASK_ID": self.task_id, "CONTROLPLANE_ATTEMPT": str(int(self.number))}
        if self.shard is not None:
            env["CONTROLPLANE_SHARD"] = str(int(self.shard))
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AttemptRef:
        """The attempt `to_env` named (attempt 1 when unset). KeyError without a task id, ValueError
        when a number is not an integer."""
        shard = env.get("CONTROLPLANE_SHARD")
        return cls(env["CONTROLPLANE_TASK_ID"], int(env.get("CONTROLPLANE_ATTEMPT", "1")),
                   int(shard) if shard else None)
