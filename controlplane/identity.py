"""Who a caller is: the owner string of its tasks, the teams it shares them with, and whether it
may act on everyone's tasks (tasks:admin).

The owner of a task is one string. A static bearer token maps to the identity the operator wrote
for it; an OAuth access token's owner is its issuer and subject, `"<issuer>#<subject>"` (an
issuer URL has no fragment, so the first `#` ends it), written with the configured issuer even
when the token spells it another way (`owner_of`). A form longer than the column
(200 characters) is stored as `"sha256:<hex of that form>"`.

A caller with nothing beyond its own tasks is a plain `str`: static tokens, stdio, the CLI, and
OAuth callers without a team or the admin scope. Otherwise it is a `Caller`, still a `str` (the
owner), so the store and every layer that only needs the owner take it as it is, and carrying
the rights costs nothing where nobody has any. What a caller may do with a task is decided here
(`may_read`, `may_cancel`), nowhere else.
"""

from __future__ import annotations

import hashlib
from typing import Any

MAX_OWNER = 200  # tasks.owner is a String(200)


class Caller(str):
    """An owner string with rights over other callers' tasks: the teams whose tasks it may read
    (`team`, the first its token names, is the one its new tasks are shared with), and `admin`
    (may read and cancel every task; each such act is audited)."""

    team: str | None
    teams: frozenset[str]
    admin: bool

    def __new__(cls, owner: str, *, teams: tuple[str, ...] = (), admin: bool = False) -> Caller:
        self = super().__new__(cls, owner)
        self.team = teams[0] if teams else None
        self.teams = frozenset(teams)
        self.admin = admin
        return self

    def __reduce__(self) -> Any:  # a str subclass with attributes: pickle them too
        return (_caller, (str(self), tuple(sorted(self.teams, key=lambda t: t != self.team)), self.admin))


def _caller(owner: str, teams: tuple[str, ...], admin: bool) -> Caller:
    return Caller(owner, teams=teams, admin=admin)


def owner_of(issuer: str, subject: str) -> str:
    """The owner string of an OAuth subject (see the module's docstring)."""
    owner = f"{issuer}#{subject}"
    if len(owner) <= MAX_OWNER:
        return owner
    return "sha256:" + hashlib.sha256(owner.encode()).hexdigest()


def team_of(issuer: str, team: str) -> str:
    """How a team is recorded with a task: per issuer, like owners."""
    return owner_of(issuer, team)


def is_admin(caller: str) -> bool:
    return isinstance(caller, Caller) and caller.admin


def team_for_new_task(caller: str) -> str | None:
    """The team a new task of this caller is shared with (the first its token names)."""
    return caller.team if isinstance(caller, Caller) else None


def may_read(caller: str, owner: str, team: str | None) -> bool:
    """Whether `caller` may read a task of `owner` shared with `team`."""
    if owner == caller:
        return True
    if not isinstance(caller, Caller):
        return False
    return caller.admin or (team is not None and team in caller.teams)


def may_cancel(caller: str, owner: str) -> bool:
    """Whether `caller` may cancel a task of `owner`: its own, or any for an admin (team members
    only read each other's tasks)."""
    return owner == caller or is_admin(caller)
