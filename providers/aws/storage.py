"""The scratch disk an AWS Batch job definition guarantees a job: the facts and where they are read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FARGATE_DEFAULT_STORAGE_GIB = 20  # a Fargate job's ephemeral storage when its job definition sets none


@dataclass(frozen=True)
class Storage:
    """What a job definition guarantees a job of scratch disk (None: nothing), and why."""

    limit_mb: int | None
    note: str


def read_definition(call: Callable[..., Any], batch: Any, ref: str) -> dict[str, Any] | None:
    """The job definition SubmitJob would use for `ref`: an ARN, name:revision, or a name
    (its latest ACTIVE revision)."""
    if ref.startswith("arn:"):
        found = call(batch.describe_job_definitions, jobDefinitions=[ref]).get("jobDefinitions", [])
    else:
        name, _, revision = ref.partition(":")
        found, token = [], None
        while True:
            kwargs: dict[str, Any] = {"jobDefinitionName": name, "status": "ACTIVE"}
            if token:
                kwargs["nextToken"] = token
            resp = call(batch.describe_job_definitions, **kwargs)
            found += resp.get("jobDefinitions", [])
            token = resp.get("nextToken")
            if not token:
                break
        if revision:
            found = [d for d in found if str(d.get("revision")) == revision]
    return max(found, key=lambda d: int(d.get("revision") or 0)) if found else None


def storage_of(ref: str, definition: dict[str, Any] | None) -> Storage:
    if definition is None:
        return Storage(None, f"AWS Batch has no active job definition {ref}")
    named = f"job definition {definition.get('jobDefinitionName', ref)}:{definition.get('revision', '?')}"
    if "FARGATE" not in (definition.get("platformCapabilities") or []):
        return Storage(None, f"{named} runs on EC2 resources, where AWS Batch reserves no disk for a job (jobs share "
                              "the instance's storage; only a Fargate job definition's ephemeralStorage is reserved)")
    props: dict[str, Any] = definition.get("containerProperties") or next(
        iter((definition.get("ecsProperties") or {}).get("taskProperties") or []), {})
    size = (props.get("ephemeralStorage") or {}).get("sizeInGiB")
    gib = int(size or FARGATE_DEFAULT_STORAGE_GIB)
    how = "its ephemeralStorage" if size else "Fargate's default, as it sets no ephemeralStorage"
    return Storage(gib * 1024, f"{named} runs on Fargate with {gib} GiB ({gib * 1024} MiB) of ephemeral storage "
                                f"({how}); a job gets its job definition's storage (SubmitJob cannot change it), so "
                                "more needs a job definition with a larger ephemeralStorage (up to 200 GiB)")
