"""The dashboard's routes, on the control plane's HTTP app beside /mcp (`controlplane.serve`):

    GET  /dashboard                           tasks (filters: state, tool, tag, owner), queues, providers,
                                              the catalog (its revision, and why a changed file was refused)
    GET  /dashboard?rows=1                    ... only the table's rows (the page refreshes them)
    GET  /dashboard/login, POST /dashboard/login, POST /dashboard/logout
    GET  /dashboard/tasks/{id}                one task: status, timeline (its audit), artifacts, logs
    GET  /dashboard/tasks/{id}/stream         its status and new log lines, as server-sent events
    POST /dashboard/tasks/{id}/cancel         cancel (X-CSRF-Token; the page asks for confirmation)
    GET  /dashboard/static/{file}             the script and the stylesheet
    GET  /metrics                             Prometheus (`controlplane.ops.metrics`)

Loopback clients only, unless CONTROLPLANE_DASHBOARD_OPEN (CONTROLPLANE_METRICS_OPEN for
/metrics): anyone else gets 404, as if nothing were there. With auth configured (static tokens,
OAuth) a browser signs in with a token (`session.py`); without it (a loopback server with no
tokens) the dashboard is the default owner's, like the MCP endpoint. Every read goes through the
task service with the session's caller, so ownership, teams and admin rights hold as on /mcp;
an unknown task and someone else's alike answer 404. Answers never carry internals: an
unexpected error is logged and answered with a plain 500 page.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from controlplane import api, sweeps
from controlplane.dashboard.session import COOKIE, Session, Sessions
from controlplane.errors import ControlPlaneError, ErrorCode, invalid
from controlplane.http.loopback import is_loopback
from controlplane.mcp.oauth import ResourceServer, caller_of
from controlplane.ops import metrics
from controlplane.states import FINAL, TaskState
from controlplane_providers import ratelimit

if TYPE_CHECKING:
    from fastmcp.server.auth import AuthProvider

    from controlplane.app import ControlPlane

log = logging.getLogger("controlplane.dashboard")
HERE = Path(__file__).parent
STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOG_LINES = 200  # the log tail a task's page opens with
SHARDS_PER_PAGE = 50  # a sweep's page
STREAM_PAGES = 5  # log pages sent per wake-up of a stream (the rest follow at once)
STATES = [s.value for s in TaskState]


@functools.cache
def templates() -> Any:
    """The page templates, loaded on the first page asked for: jinja2 (and sse_starlette, for the
    live pages) are imported then, not at every server's start."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    return Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                       trim_blocks=True, lstrip_blocks=True)


def routes(cp: ControlPlane, auth: AuthProvider | None) -> list[Route]:
    settings = cp.settings
    svc = cp.service
    secure = (cp.public_url or "").startswith("https://")
    sessions = Sessions(cp.secret_key, settings.dashboard_session_s)
    own_metrics = metrics.registry_for(svc.overview, cp.breakers.states)
    local = Session(settings.default_owner, (), False, True, True, float("inf"), "local")  # no auth: the default owner

    def reachable(request: Request, open_: bool) -> bool:
        return open_ or (request.client is not None and is_loopback(request.client.host))

    def session_of(request: Request) -> Session | None:
        return local if auth is None else sessions.read(request.cookies.get(COOKIE))

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(templates().get_template(name).render(**context), status_code=status, headers=HEADERS)

    def guarded(handler: Callable[[Request, Session], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Loopback (or opened), signed in, and no internals in an error."""

        async def endpoint(request: Request) -> Response:
            if not reachable(request, settings.dashboard_open):
                return Response("not found", status_code=404)
            session = session_of(request)
            if session is None:
                if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                    return RedirectResponse("/dashboard/login", status_code=303)
                return JSONResponse({"error": "sign in first"}, status_code=401, headers=HEADERS)
            try:
                return await handler(request, session)
            except ControlPlaneError as e:
                status = {ErrorCode.NOT_FOUND: 404, ErrorCode.FORBIDDEN: 403}.get(e.code, 400)
                if request.method == "POST":
                    return JSONResponse({"code": e.code.value, "message": e.message}, status_code=status,
                                        headers=HEADERS)
                return page("error.html", status, message=e.message, session=session)
            except ValidationError as e:
                problem = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
                return page("error.html", 400, message=f"bad request: {problem}", session=session)
            except Exception:  # noqa: BLE001 - the log has it; the browser gets nothing internal
                log.exception("dashboard: %s %s failed", request.method, request.url.path)
                return page("error.html", 500, message="internal error (see the server's log)", session=session)

        return endpoint

    async def call(fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    # ---- sign-in ----------------------------------------------------------------------------------
    async def login_form(request: Request) -> Response:
        if not reachable(request, settings.dashboard_open):
            return Response("not found", status_code=404)
        if auth is None:
            return RedirectResponse("/dashboard", status_code=303)
        return page("login.html", error=None)

    async def login(request: Request) -> Response:
        if not reachable(request, settings.dashboard_open):
            return Response("not found", status_code=404)
        if auth is None:
            return RedirectResponse("/dashboard", status_code=303)
        form = await request.form()
        token = form.get("token")
        verified = await auth.verify_token(token.strip()) if isinstance(token, str) and token.strip() else None
        caller = caller_of(verified)
        if verified is None or caller is None:
            log.info("dashboard sign-in refused")  # never the token
            return page("login.html", 401, error="that token was not accepted")
        read = cancel = True
        if isinstance(auth, ResourceServer):
            scopes = auth.tokens.scopes
            read, cancel = scopes.granted(scopes.read, verified.scopes), scopes.granted(scopes.cancel, verified.scopes)
        if not read:
            return page("login.html", 403, error=f"that token lacks the scope {scopes.read}")
        teams = tuple(sorted(getattr(caller, "teams", ()), key=lambda t: t != getattr(caller, "team", None)))
        _session, cookie = sessions.issue(str(caller), teams=teams, admin=bool(getattr(caller, "admin", False)),
                                          read=read, cancel=cancel, not_after=verified.expires_at)
        out = RedirectResponse("/dashboard", status_code=303)
        out.set_cookie(COOKIE, cookie, max_age=int(settings.dashboard_session_s), path="/dashboard", httponly=True,
                       samesite="strict", secure=secure)
        return out

    async def logout(request: Request) -> Response:
        out = RedirectResponse("/dashboard/login" if auth is not None else "/dashboard", status_code=303)
        out.delete_cookie(COOKIE, path="/dashboard", httponly=True, samesite="strict", secure=secure)
        return out

    # ---- pages ------------------------------------------------------------------------------------
    async def tasks(request: Request, session: Session) -> Response:
        q = request.query_params
        filters = {"state": q.get("state") or "", "tool": q.get("tool") or "", "tag": q.get("tag") or "",
                   "owner": q.get("owner") or ""}
        if filters["state"] and filters["state"] not in STATES:
            raise invalid(f"state: one of {', '.join(STATES)}")
        req = api.ListTasks(states=[TaskState(filters["state"])] if filters["state"] else None,
                            tool_name=filters["tool"] or None, tags_any=[filters["tag"]] if filters["tag"] else None,
                            owner=filters["owner"] or None, cursor=q.get("cursor") or None, limit=50,
                            # A sweep is one row, on one page, unless the list is of a state: its
                            # shards in that state are then rows of their own (a sweep as a whole
                            # is in no task state).
                            whole_sweeps=not filters["state"])
        listed = await call(svc.list, session.caller, req)
        context = {"tasks": listed["tasks"], "next_cursor": listed["next_cursor"], "filters": filters,
                   "session": session, "csrf": sessions.csrf(session)}
        if q.get("rows"):
            return page("rows.html", **context)
        overview, moves = await call(svc.overview), await call(svc.moves)
        return page("tasks.html", **context, queues=overview.queues, moves=moves, states=STATES,
                    tools=sorted(cp.catalog.tools), health=provider_health(), catalog=cp.catalog_status,
                    owners=session.admin or bool(session.teams))

    def provider_health() -> dict[str, Any]:
        """What the reconciler saw of each provider's polls and each placement site's breaker (the
        leader's memory), and what passed each cloud API's limiter in this process."""
        seen = cp.reconciler.health.snapshot()
        return {"leader": cp.is_leader,
                "providers": [(name, seen.get(name)) for name in sorted(cp.providers)],
                "breakers": sorted(cp.breakers.states().items()),
                "limiters": [(n.split(":")[:3], lim) for n, lim in ratelimit.limiters()]}

    async def task(request: Request, session: Session) -> Response:
        task_id = request.path_params["task_id"]
        status = await call(svc.status, session.caller, api.GetTaskStatus(task_id=task_id))
        timeline = await call(svc.timeline, session.caller, task_id)
        result = await call(svc.result, session.caller, api.GetTaskResult(task_id=task_id))
        logs = await call(svc.tail, session.caller, api.TailTaskLogs(task_id=task_id, from_end=True, limit=LOG_LINES))
        return page("task.html", task=status, timeline=timeline, result=result, logs=logs, session=session,
                    csrf=sessions.csrf(session), ended=status["state"] in FINAL, cost=cost_text(status))

    async def sweep(request: Request, session: Session) -> Response:
        sweep_id = request.path_params["sweep_id"]
        status = await call(svc.sweep_status, session.caller, api.GetSweepStatus(sweep_id=sweep_id))
        shards = await call(svc.sweep_result, session.caller, api.GetSweepResult(
            sweep_id=sweep_id, cursor=request.query_params.get("cursor") or None, limit=SHARDS_PER_PAGE))
        return page("sweep.html", sweep=status, line=sweeps.shards_text(status), state=sweeps.sweep_state(status),
                    shards=shards["results"], next_cursor=shards["next_cursor"], session=session)

    async def stream(request: Request, session: Session) -> Response:
        task_id = request.path_params["task_id"]
        cursor = request.query_params.get("cursor") or None
        first = await call(svc.status, session.caller, api.GetTaskStatus(task_id=task_id))  # NOT_FOUND before streaming

        async def events() -> AsyncIterator[dict[str, Any]]:
            nonlocal cursor
            status = first
            async with aclosing(cp.hub.watch(task_id, read=None, quiet_s=1.0)) as changes:
                while True:
                    yield {"event": "status", "data": json.dumps(_status_view(status))}
                    more = True
                    for _ in range(STREAM_PAGES):
                        page_ = await call(svc.tail, session.caller,
                                           api.TailTaskLogs(task_id=task_id, cursor=cursor, limit=500))
                        cursor = page_["next_cursor"]
                        if page_["lines"]:
                            yield {"event": "logs", "data": json.dumps(page_["lines"])}
                        more = page_["has_more"]
                        if not more:
                            break
                    if status["state"] in FINAL and not more:
                        yield {"event": "end", "data": json.dumps({"state": status["state"]})}
                        return
                    if not more:
                        await changes.__anext__()  # a change, or a quiet second
                    status = await call(svc.status, session.caller, api.GetTaskStatus(task_id=task_id))

        from sse_starlette import EventSourceResponse

        return EventSourceResponse(events(), ping=15, headers=HEADERS)

    async def cancel(request: Request, session: Session) -> Response:
        if not sessions.csrf_ok(session, request.headers.get("x-csrf-token")):
            return JSONResponse({"error": "missing or wrong X-CSRF-Token"}, status_code=403, headers=HEADERS)
        if not session.cancel:
            return JSONResponse({"error": "this sign-in may not cancel (scope)"}, status_code=403, headers=HEADERS)
        out = await call(svc.cancel, session.caller, api.CancelTask(task_id=request.path_params["task_id"],
                                                                     reason="cancelled from the dashboard"))
        return JSONResponse(out, headers=HEADERS)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC or not reachable(request, settings.dashboard_open):
            return Response("not found", status_code=404)
        return FileResponse(HERE / "static" / name, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def scrape(request: Request) -> Response:
        if not settings.metrics or not reachable(request, settings.metrics_open):
            return Response("not found", status_code=404)
        body = await call(metrics.exposition, own_metrics)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    out = [Route("/metrics", scrape, methods=["GET"])]
    if settings.dashboard:
        out += [
            Route("/dashboard", guarded(tasks), methods=["GET"]),
            Route("/dashboard/login", login_form, methods=["GET"]),
            Route("/dashboard/login", login, methods=["POST"]),
            Route("/dashboard/logout", logout, methods=["POST"]),
            Route("/dashboard/static/{name}", static, methods=["GET"]),
            Route("/dashboard/tasks/{task_id}", guarded(task), methods=["GET"]),
            Route("/dashboard/sweeps/{sweep_id}", guarded(sweep), methods=["GET"]),
            Route("/dashboard/tasks/{task_id}/stream", guarded(stream), methods=["GET"]),
            Route("/dashboard/tasks/{task_id}/cancel", guarded(cancel), methods=["POST"]),
        ]
    return out


def cost_text(status: dict[str, Any]) -> str | None:
    """A task's usage and estimated cost as its page shows them (`get_task_status`'s `usage` and
    `estimated_cost`); None while nothing is recorded (the task has not run)."""
    used, cost = status.get("usage") or {}, status.get("estimated_cost") or {}
    if status.get("started_at") is None and not used.get("run_seconds"):
        return None
    amount = cost.get("amount")
    priced = f"{amount:.6f} {cost.get('currency', '')}" if amount is not None else "not priced (no list price)"
    shape = [f"{used.get('run_seconds', 0):g} s run", f"{used.get('vcpu_seconds', 0):g} vCPU-s",
             f"{used.get('memory_gib_seconds', 0):g} GiB-s"] + \
        ([f"{used['gpu_seconds']:g} GPU-s"] if used.get("gpu_seconds") else [])
    so_far = "" if status["state"] in FINAL else " so far"
    at_submit = cost.get("at_submit")
    estimate = f"; estimated at submit {at_submit:.6f} {cost.get('currency', '')}" if at_submit is not None else ""
    return f"{priced}{so_far} ({', '.join(shape)}){estimate}"


def _status_view(status: dict[str, Any]) -> dict[str, Any]:
    """What a task's page updates live."""
    progress = status.get("progress") or {}
    return {"state": status["state"], "attempt": status["attempt"], "percent": progress.get("percent"),
            "cost": cost_text(status),
            "message": progress.get("message"), "phase": progress.get("phase"), "eta_s": progress.get("eta_s"),
            "updated_at": status["updated_at"], "cancel_requested": status["cancel_requested"],
            "error": (status.get("error") or {}).get("message") if isinstance(status.get("error"), dict) else None}
