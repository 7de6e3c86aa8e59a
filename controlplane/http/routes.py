"""HTTP routes that are not MCP: the runner callback API and signed artifact downloads.

    POST /runner/v1/tasks/{task_id}/attempts/{attempt}/claim    runner: bootstrap token -> secret
    POST /runner/v1/tasks/{task_id}/attempts/{attempt}/events   runner -> control plane
    POST /runner/v1/tasks/{task_id}/attempts/{attempt}/grants   runner: signed URLs for its own keys
    GET  /objects/{store}/{key}?expires=&filename=&signature=    signed download (a local store)
    PUT  /uploads/{store}/{key}?expires=&size=&signature=        signed upload (`http/uploads.py`)
    GET  /healthz

These routes are not behind the MCP bearer auth: a runner trades its attempt's one-time bootstrap
token (the only credential in the job's spec) for the attempt's secret once, with a nonce of its
own, and authenticates its events with that secret; downloads carry the link's HMAC signature.
Answers never include internals.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from controlplane.http.uploads import upload_routes
from controlplane.ids import AttemptRef
from controlplane.launch import bootstrap_token, runner_secret
from controlplane.objectstore.base import UnsafeKey, guess_content_type
from controlplane.objectstore.claim import nonce_digest, take_claim
from controlplane.objectstore.grants import MAX_NAMES, grant_method, sign_grants
from controlplane.ops import logs, metrics
from controlplane.states import FINAL
from controlplane.store import StaleAttempt, inputs
from controlplane.store.conflicts import rerun

if TYPE_CHECKING:
    from controlplane.attempts import Attempts
    from controlplane.objectstore.registry import ObjectStores
    from controlplane.store import Store
    from controlplane.store.rows import TaskRow

log = logging.getLogger("controlplane.http")
MAX_EVENTS_BODY = 16 * 1024 * 1024


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, **({"code": code} if code else {})}, status_code=status)


@dataclass(frozen=True)
class RouteDeps:
    """What the routes use, and nothing more."""

    secret_key: bytes  # derives the runners' bootstrap tokens and secrets
    store: Store  # tasks, jobs (the runner's secret claim)
    attempts: Attempts  # where a runner's events and heartbeats go
    object_stores: ObjectStores  # local object stores, for signed downloads
    wake: Callable[[], None]  # nudges the loops after a finished or cancelled attempt
    grant_ttl_s: int = 900  # lifetime of a grant asked for as it is needed
    grant_run_margin_s: int = 1800  # a grant asked for ahead lives the task's max runtime plus this


def routes(cp: RouteDeps) -> list[Route]:
    def authenticate(request: Request, credential: Callable[[bytes, AttemptRef], str]) -> AttemptRef | Response:
        """The attempt a runner route names, if its bearer is that attempt's `credential`."""
        try:
            ref = AttemptRef(request.path_params["task_id"], int(request.path_params["attempt"]))
        except ValueError:
            return _error(404, "not found")
        auth = request.headers.get("authorization", "")
        expected = "Bearer " + credential(cp.secret_key, ref)
        if not hmac.compare_digest(auth.encode(), expected.encode()):
            return _error(401, "bad runner credentials")
        return ref

    async def current(ref: AttemptRef) -> TaskRow | None:
        """The task, if `ref` is its current attempt and it has not ended."""
        task = await anyio.to_thread.run_sync(cp.store.tasks.get, ref.task_id)
        return task if task is not None and task.attempt == ref.number and task.state not in FINAL else None

    async def small_json(request: Request, credential: Callable[[bytes, AttemptRef], str],
                         limit: int) -> tuple[AttemptRef, dict[str, Any]] | Response:
        """(attempt, body) of an authenticated call whose body is a small JSON object
        (past `limit` bytes or not an object: an empty one, which the route then refuses)."""
        who = authenticate(request, credential)
        if isinstance(who, Response):
            return who
        body = await request.body()
        try:
            payload = json.loads(body[:limit] or b"{}")
        except ValueError:
            payload = None
        return who, payload if isinstance(payload, dict) else {}

    async def runner_claim(request: Request) -> Response:
        call = await small_json(request, bootstrap_token, 4096)
        if isinstance(call, Response):
            return call
        ref, payload = call
        nonce = payload.get("nonce")
        if not isinstance(nonce, str) or not 32 <= len(nonce) <= 256:
            return _error(400, "body must be {\"nonce\": a random string of 32 to 256 characters}")
        task = await current(ref)
        if task is None:
            return _error(409, "this attempt is no longer current", "ATTEMPT_OVER")
        digest = nonce_digest(nonce)
        try:  # the object store decides, so that a runner that claimed it without us is seen too
            holder = await anyio.to_thread.run_sync(
                lambda: take_claim(cp.object_stores.get(task.store_url), ref, digest, by="control-plane"))
        except OSError:
            log.warning("the claim of %s/%s could not be written to the object store", ref.task_id, ref.number,
                        extra=logs.of_attempt(ref, "claim_failed"))
            return _error(503, "the object store did not answer; try again")
        claimed = await anyio.to_thread.run_sync(cp.store.jobs.claim_runner_secret, ref, holder)
        if claimed is None:
            return _error(409, "this attempt is no longer current", "ATTEMPT_OVER")
        if not claimed or holder != digest:
            log.warning("a second execution of %s/%s claimed it and was refused", ref.task_id, ref.number,
                        extra=logs.of_attempt(ref, "claim_refused"))
            await anyio.to_thread.run_sync(refused_claim, ref)
            return _error(403, "another execution holds this attempt's claim", "ALREADY_CLAIMED")
        log.info("the runner of %s/%s claimed it", ref.task_id, ref.number,
                 extra=logs.of_attempt(ref, "claim"))
        return JSONResponse({"secret": runner_secret(cp.secret_key, ref)},
                            headers={"Cache-Control": "no-store"})

    def refused_claim(ref: AttemptRef) -> None:
        """An extra execution of the attempt: counted on its job for the reconciler to stop."""
        cp.store.jobs.note_refused_claim(ref)
        job = cp.store.jobs.get(ref)
        metrics.extra_executions(job.provider if job is not None else "unknown", "refused")

    async def runner_events(request: Request) -> Response:
        ref = authenticate(request, runner_secret)
        if isinstance(ref, Response):
            return ref
        if int(request.headers.get("content-length") or 0) > MAX_EVENTS_BODY:
            return _error(413, "batch too large")
        body = await request.body()
        if len(body) > MAX_EVENTS_BODY:
            return _error(413, "batch too large")
        try:
            payload = json.loads(body or b"{}")
            events = payload.get("events", [])
            if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
                raise ValueError
        except (ValueError, AttributeError):
            return _error(400, "body must be {\"events\": [objects]}")

        if not events:  # a heartbeat: cheap, buffered, written in batches
            task = await current(ref)
            if task is None:
                return _error(409, "this attempt is no longer current")
            cp.attempts.beat(ref, time.time())
            job = await anyio.to_thread.run_sync(cp.store.jobs.get, ref)
            return JSONResponse({"ack_seq": job.event_seq if job else 0, "cancel": bool(task.cancel_requested)})
        try:
            # A batch is applied by its events' seqs: a transaction PostgreSQL aborted for a
            # conflict is run again, from the start (`store.conflicts`).
            result = await anyio.to_thread.run_sync(
                lambda: rerun(lambda: cp.attempts.apply(ref, events), "a runner's events"))
        except StaleAttempt:
            return _error(409, "this attempt is no longer current")
        except Exception:  # noqa: BLE001
            log.exception("ingesting events of %s/%s failed", ref.task_id, ref.number,
                          extra=logs.of_attempt(ref, "events_failed"))
            return _error(500, "internal error")
        if result.finished or result.cancel:
            cp.wake()
        return JSONResponse({"ack_seq": result.ack_seq, "cancel": result.cancel})

    async def runner_grants(request: Request) -> Response:
        """Signed URLs for keys of the caller's own attempt (`controlplane.objectstore.grants`):
        `{"names": [...], "ahead": false}` -> `{"grants": {name: {method, url, headers}},
        "expires_in": s}`. `ahead: true` asks for grants that last the task's whole run (result.json
        and spill keys, used if the callback goes down)."""
        call = await small_json(request, runner_secret, 64 * 1024)
        if isinstance(call, Response):
            return call
        ref, payload = call
        names, ahead = payload.get("names"), payload.get("ahead", False)
        if not isinstance(names, list) or not 1 <= len(names) <= MAX_NAMES or not isinstance(ahead, bool):
            return _error(400, f"body must be {{\"names\": [1 to {MAX_NAMES} names], \"ahead\": bool}}",
                          "INVALID_REQUEST")
        for name in names:
            try:
                grant_method(name)
            except UnsafeKey as e:
                return _error(400, f"cannot grant {str(name)[:100]!r}: {e}", "INVALID_REQUEST")
        task = await current(ref)
        if task is None:
            return _error(409, "this attempt is no longer current")
        objects = cp.object_stores.get(task.store_url)
        ttl = task.max_runtime_s + cp.grant_run_margin_s if ahead else cp.grant_ttl_s
        ttl = min(ttl, objects.max_url_ttl_s)
        files = None
        if any(str(n).startswith("inputs/") or n == "input_files.json" for n in names):
            rows = await anyio.to_thread.run_sync(inputs.of, cp.store.db, ref.task_id)  # where admission found them
            files = {r.field: (cp.object_stores.get(r.store_url), r.storage_key) for r in rows
                     if r.resolved and r.kind != "url"}
            if not rows:  # no file inputs: no input_files.json to read (the answer leaves it out)
                names = [n for n in names if n != "input_files.json"]
        try:
            grants = await anyio.to_thread.run_sync(
                lambda: sign_grants(objects, ref, names, expires_in=ttl, files=files))
        except NotImplementedError:
            return _error(409, "this task's object store cannot sign uploads", "CAPABILITY_MISSING")
        except Exception:  # noqa: BLE001
            log.exception("signing grants for %s/%s failed", ref.task_id, ref.number,
                          extra=logs.of_attempt(ref, "grants_failed"))
            return _error(503, "could not sign; retry later", "INTERNAL")
        return JSONResponse({"grants": grants, "expires_in": ttl}, headers={"Cache-Control": "no-store"})

    async def download(request: Request) -> Response:
        objects = cp.object_stores.local(request.path_params["store"])
        key = request.path_params["key"]
        q = request.query_params
        signer = objects.signer if objects is not None else None
        if objects is None or signer is None:
            return _error(404, "not found")
        filename = q.get("filename", "")
        if not signer.verify(key, q.get("expires", ""), filename, q.get("signature", "")):
            return _error(403, "invalid or expired link")
        try:
            path = objects.path_of(key)
        except UnsafeKey:
            return _error(404, "not found")
        if not path.is_file():
            return _error(404, "not found")
        return FileResponse(path, filename=filename or path.name, media_type=guess_content_type(key),
                            headers={"Cache-Control": "private, max-age=60"})

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"ok": True})

    return [
        Route("/runner/v1/tasks/{task_id}/attempts/{attempt}/claim", metrics.timed_callback("claim", runner_claim),
              methods=["POST"]),
        Route("/runner/v1/tasks/{task_id}/attempts/{attempt}/events", metrics.timed_callback("events", runner_events),
              methods=["POST"]),
        Route("/runner/v1/tasks/{task_id}/attempts/{attempt}/grants", metrics.timed_callback("grants", runner_grants),
              methods=["POST"]),
        Route("/objects/{store}/{key:path}", download, methods=["GET", "HEAD"]),
        Route("/healthz", healthz, methods=["GET"]),
        *upload_routes(cp.object_stores, cp.store.uploads.takes_bytes),
    ]

