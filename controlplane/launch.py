"""From a scheduled task to a `LaunchSpec`: the job contract the runner is started with, and the
submit-time check that a provider can give the job what the task asks for beyond cpu, memory and
GPUs (`check_scratch`).

Also derives the per-attempt runner credentials, HMACs of the attempt (`AttemptRef.message`) under the server
key, so nothing secret is stored and a restarted control plane (or another replica) still
recognises them:

* the **bootstrap token** goes into the job's environment. A job's spec can be read back through
  the cloud's API (DescribeJobs, executions.get), so it carries nothing that lasts: the runner
  trades the token once, on start, for the attempt's secret (`POST .../claim` with a nonce of
  its own); the claim is recorded, and a token read later is dead (only the same nonce may
  claim again, so a runner whose first answer was lost can retry);
* the **runner secret** authenticates the attempt's event callbacks. It never leaves the
  control plane except in the answer to the one claim.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from typing import Any

from controlplane import blocking
from controlplane.catalog import Catalog, ResourceClass
from controlplane.errors import ControlPlaneError, ErrorCode, invalid
from controlplane.ids import AttemptRef
from controlplane.settings import Settings
from controlplane.store.rows import JobRow, TaskRow
from controlplane_providers.base import LaunchSpec, Provider, ProviderOptions, Shape, TransientProviderError
from controlplane_runner.materialize import INPUT_FILES_ENV


def runner_secret(key: bytes, ref: AttemptRef) -> str:
    return hmac.new(key, ref.message("runner"), hashlib.sha256).hexdigest()


def bootstrap_token(key: bytes, ref: AttemptRef) -> str:
    return hmac.new(key, ref.message("bootstrap"), hashlib.sha256).hexdigest()


def mover_nonce(key: bytes, ref: AttemptRef) -> str:
    """The nonce of the control plane's own claim on an attempt it moves (no runner can make it)."""
    return hmac.new(key, ref.message("move"), hashlib.sha256).hexdigest()


def build_launch_spec(task: TaskRow, job: JobRow, catalog: Catalog, settings: Settings, *,
                      secret_key: bytes, callback_url: str | None, store_url: str, python: str) -> LaunchSpec:
    """The job of `task`'s attempt at the placement `job` runs on. `python` is what `{python}` in
    the tool's command means on that placement's provider. LookupError when the tool as
    admitted is unknown or has no such placement."""
    admitted = catalog.admitted(task.tool_name, task.resource_class, task.submitted_at)  # as at submit
    tool, rc = admitted.tool, admitted.resource_class
    if not 0 <= job.placement < len(admitted.placements) or admitted.placements[job.placement].provider != job.provider:
        raise LookupError(f"tool '{tool.name}' has no placement {job.placement} on the {job.provider} provider")
    res = json.loads(task.resources_json or "{}")
    env = dict(tool.env)
    env.update({
        **task.ref.to_env(),
        "CONTROLPLANE_JOB_NAME": job.job_name,
        "CONTROLPLANE_STORE_URL": store_url,
        "CONTROLPLANE_HEARTBEAT_S": str(settings.heartbeat_interval_s),
        "CONTROLPLANE_KILL_GRACE_S": str(settings.kill_grace_s),
        "CONTROLPLANE_CLAIM_WAIT_S": str(settings.claim_wait_s),
    })
    if settings.job_store_access != "identity":
        env["CONTROLPLANE_STORE_ACCESS"] = settings.job_store_access
    if callback_url:
        env["CONTROLPLANE_CALLBACK_URL"] = callback_url
        env["CONTROLPLANE_BOOTSTRAP_TOKEN"] = bootstrap_token(secret_key, task.ref)
    return LaunchSpec(
        task_id=task.task_id, attempt=task.attempt, job_name=job.job_name, tool_name=tool.name,
        owner=task.owner, command=tuple(c.replace("{python}", python) for c in tool.command), image=tool.image,
        env=env, **asked_shape(res, rc),
        scratch_mb=int(res.get("scratch_mb") or 0),  # what the task asked for: a class reserves nothing by itself
        max_runtime_s=int(task.max_runtime_s), resource_class=rc.name,
        options=admitted.placements[job.placement].options,
    )


def with_file_inputs(spec: LaunchSpec) -> LaunchSpec:
    """`spec` for a task whose inputs refer to files: the runner reads `input_files.json` (an
    object-store GET, or a grant) only when its job says `CONTROLPLANE_INPUT_FILES=1`."""
    return dataclasses.replace(spec, env={**spec.env, INPUT_FILES_ENV: "1"})


def asked_shape(res: dict[str, Any], rc: ResourceClass) -> dict[str, Any]:
    """The cpu, memory_mb and gpu a task's job is launched with: what its `resources` asked for,
    else its resource class's (also what its usage is counted from, `controlplane.prices`)."""
    gpu = res.get("gpu")
    return {"cpu": float(res.get("cpu") or rc.cpu), "memory_mb": int(res.get("memory_mb") or rc.memory_mb),
            "gpu": int(gpu if gpu is not None else rc.gpu)}


def check_scratch(providers: dict[str, Provider[Any]], catalog: Catalog, tool_name: str, rc_name: str,
                  asked: int | None) -> None:
    """INVALID_REQUEST naming `resources.scratch_mb`, with the provider's reason, unless the task's
    job will really have `asked` MiB of scratch disk wherever it runs: at most the resource
    class's `scratch_mb` (when it sets one) and what each of the tool's placements' providers
    guarantees for the class's shape. 0 or None asks for nothing. A provider may have to ask its
    cloud (a job definition), so this may block."""
    if not asked:
        return
    rc = catalog.resource_classes[rc_name]
    if rc.scratch_mb is not None and asked > rc.scratch_mb:
        raise invalid(f"resources.scratch_mb={asked} exceeds resource class '{rc_name}' limit of {rc.scratch_mb}")
    for placed in catalog.placements(tool_name):
        _check_scratch_at(providers.get(placed.provider), placed.provider, placed.options, rc, asked)


def _check_scratch_at(provider: Provider[Any] | None, name: str, options: ProviderOptions, rc: ResourceClass,
                      asked: int) -> None:
    rc_name = rc.name
    if provider is None:
        raise invalid(f"resources.scratch_mb: the {name} provider is not available to confirm scratch disk")
    shape = Shape(rc.name, rc.cpu, rc.memory_mb, rc.gpu, options)
    blocking.must_not_block()
    try:
        limit = provider.scratch_limit_mb(shape)
        if limit is not None and asked <= limit:
            return
        note = provider.scratch_note(shape)
    except TransientProviderError:
        raise ControlPlaneError(ErrorCode.QUEUE_OVERLOADED, f"resources.scratch_mb: the {provider.name} provider "
                                "could not be asked what scratch disk it can guarantee (throttled or unavailable)",
                                hint="retry later") from None
    if limit is None:
        raise invalid(f"resources.scratch_mb: the {provider.name} provider cannot reserve scratch disk for this task: "
                      f"{note}", hint="omit resources.scratch_mb, or use a tool whose provider can guarantee disk")
    raise invalid(f"resources.scratch_mb={asked} exceeds the {limit} MiB of scratch disk the {provider.name} provider "
                  f"guarantees for resource class '{rc_name}': {note}")
