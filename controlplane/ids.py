"""Opaque, unguessable identifiers and the job names derived from them.

Ids carry 128 random bits (no clock, no counter) so that knowing one id says nothing about
another. Job names are a pure function of (task id, attempt): a control plane that restarts
finds what it launched by name, and a name is valid for every provider (lowercase letters,
digits and '-', starting with a letter, at most 63 characters).
"""

from __future__ import annotations

import base64
import secrets


def _random_token() -> str:
    return base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def new_task_id() -> str:
    return "tsk_" + _random_token()


def new_artifact_id() -> str:
    return "art_" + _random_token()


def new_worker_id() -> str:
    return "wrk_" + _random_token()


def job_name(task_id: str, attempt: int) -> str:
    """`cp-<token>-a<attempt>`: deterministic, so a restart can look the job up."""
    return f"cp-{task_id.removeprefix('tsk_')}-a{attempt}"
