"""OAuth 2.1 resource server for the HTTP transport (the MCP authorization specification, which
2025-11-25 and 2026-07-28 share): access tokens from the operator's identity provider.

What fastmcp does, and what is ours:

* `JwksVerifier` (`controlplane.mcp.jwks`, fastmcp's `JWTVerifier` with the algorithms each key
  of the issuer's JWKS is for: RS*, PS*, ES*, EdDSA, never `none` nor an HMAC one) checks a JWT:
  its signature, keys cached an hour and fetched again when a token names a key it does not
  know, at most once per `CONTROLPLANE_AUTH_JWKS_REFRESH_S` (a removed key is refused once the
  set was read again), `iss`, `aud` (when the audience claim is `aud`) and `exp`. fastmcp's
  `JWTVerifier` checks HS* tokens with the one configured secret. fastmcp's
  `IntrospectionTokenVerifier` asks an RFC 7662 endpoint about opaque tokens. A JWT once verified
  is trusted again, unchecked, for `CONTROLPLANE_AUTH_VERIFIED_CACHE_S` (60 s) at most and never
  past its `exp`: its signature check is most of what OAuth costs a call.
* `OAuthTokens` (ours) wraps them and adds what they leave out: `nbf` (with
  `CONTROLPLANE_AUTH_LEEWAY_S` of skew), a JWT without `exp` refused, `client_id` as the audience
  for Cognito access tokens, required claim values, implicit scopes, and the caller's identity:
  owner `"<issuer>#<sub>"`, the team claim, and `tasks:admin` (`controlplane.identity`).
* fastmcp's `RemoteAuthProvider` serves the RFC 9728 metadata at
  `/.well-known/oauth-protected-resource/mcp`, and `ResourceServer` (ours) also at the root form
  `/.well-known/oauth-protected-resource`, where MCP clients look when a challenge names no
  document; fastmcp's `RequireAuthMiddleware` answers 401 with `WWW-Authenticate: Bearer
  resource_metadata="...", scope="..."`. Tokens are read on the MCP endpoint only: the runner
  callbacks and downloads carry their own credentials (an attempt's secret, a link's signature),
  which are never handed to a verifier (nor to an introspection endpoint).
* The scope each operation needs (`needed_scope`) is checked per request by
  `controlplane.http.scopes.ScopeGate` (403 `insufficient_scope`).

A token is never passed on: nothing sends it anywhere but to the introspection endpoint that
is configured to judge it. Verification failures are logged without the token and answered
with the same 401 whatever went wrong.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
from fastmcp.server.auth import AccessToken, AuthProvider, RemoteAuthProvider, TokenVerifier
from fastmcp.server.auth.providers.introspection import IntrospectionTokenVerifier
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.utilities.auth import decode_jwt_header
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.auth.routes import build_resource_metadata_url
from pydantic import AnyHttpUrl, Field
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.routing import Route

from controlplane.identity import Caller, owner_of, team_of
from controlplane.mcp.auth import BearerTokens, digest, load_tokens
from controlplane.mcp.jwks import JwksVerifier
from controlplane.settings import Settings, csv

log = logging.getLogger("controlplane.auth")

MCP_PATH = "/mcp"
ROOT_METADATA_PATH = "/.well-known/oauth-protected-resource"
MAX_VERIFIED = 10_000  # verified JWTs remembered at once (`OAuthTokens.verify_token`)

# ---- which scope each operation needs --------------------------------------------------------------
READ_TOOLS = frozenset({"get_task_status", "tail_task_logs", "list_tasks", "get_task_result", "wait_task",
                        "usage_report", "get_sweep_status", "get_sweep_result", "wait_sweep"})
CANCEL_TOOLS = frozenset({"cancel_task", "cancel_sweep"})
# Discovery needs a valid token and no scope: a client learns what there is before asking for more.
OPEN_METHODS = frozenset({"initialize", "ping", "server/discover", "tools/list", "prompts/list", "resources/list",
                          "resources/templates/list", "logging/setLevel"})
SUBMIT_METHODS = frozenset({"prompts/get", "tasks/update"})  # a prompt renders a submit; an update feeds a task
CANCEL_METHODS = frozenset({"tasks/cancel"})
# Everything else reads tasks: tasks/get, tasks/list, tasks/result, resources/read (task://),
# resources/subscribe and unsubscribe, subscriptions/listen, completion/complete (your task ids
# and earlier inputs) and the tool-argument completion extension; and any method not named here.


@dataclass(frozen=True)
class Scopes:
    submit: str = "tasks:submit"
    read: str = "tasks:read"
    cancel: str = "tasks:cancel"
    admin: str = "tasks:admin"
    request_prefix: str = ""  # Entra ID: "api://<client id>/" where clients ask, bare in tokens

    @classmethod
    def of(cls, settings: Settings) -> Scopes:
        return cls(settings.auth_scope_submit, settings.auth_scope_read, settings.auth_scope_cancel,
                   settings.auth_scope_admin, settings.auth_scope_request_prefix)

    def requested(self, names: list[str]) -> list[str]:
        """Scope names as clients ask for them."""
        return [self.request_prefix + n for n in names]

    @property
    def supported(self) -> list[str]:
        return self.requested([self.submit, self.read, self.cancel, self.admin])

    @property
    def own(self) -> list[str]:
        """Everything an agent does with its own tasks (not admin), as tokens carry them."""
        return [self.submit, self.read, self.cancel]

    @property
    def challenge(self) -> list[str]:
        """What a 401 asks for: the scopes of an agent's own work."""
        return self.requested(self.own)

    def needed(self, method: str, tool: str | None) -> str | None:
        """The scope a request needs (None: a valid token is enough)."""
        if method == "tools/call":
            if tool in READ_TOOLS:
                return self.read
            if tool in CANCEL_TOOLS:
                return self.cancel
            return self.submit  # submit_task, the catalog tools (and unknown names, answered INVALID_REQUEST)
        if method in OPEN_METHODS or method.startswith("notifications/"):
            return None
        if method in SUBMIT_METHODS:
            return self.submit
        if method in CANCEL_METHODS:
            return self.cancel
        return self.read

    def granted(self, needed: str, held: list[str] | frozenset[str] | set[str]) -> bool:
        """tasks:admin stands in for read and cancel (an admin acts on every task)."""
        return needed in held or (needed in (self.read, self.cancel) and self.admin in held)


# ---- tokens ---------------------------------------------------------------------------------------
class CallerToken(AccessToken):
    """A verified access token with the caller it stands for (`controlplane.identity`):
    `client_id` is the owner string, `caller` the owner with its team and admin rights."""

    caller: Any = Field(default=None, exclude=True)


class AuthConfigError(ValueError):
    pass


def _looks_like_jwt(token: str) -> bool:
    if token.count(".") != 2:
        return False
    try:
        return isinstance(decode_jwt_header(token).get("alg"), str)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False


def discover_jwks_uri(issuer: str, timeout_s: float = 10.0) -> str:
    """The issuer's `jwks_uri` from its OpenID discovery document (else its RFC 8414 metadata)."""
    base = issuer.rstrip("/")
    host, _, path = base.partition("://")[2].partition("/")
    scheme = base.partition("://")[0]
    candidates = [f"{base}/.well-known/openid-configuration",
                  f"{scheme}://{host}/.well-known/oauth-authorization-server" + (f"/{path}" if path else "")]
    for url in candidates:
        try:
            r = httpx.get(url, timeout=timeout_s)
            doc = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("jwks_uri"), str):
            if str(doc.get("issuer", "")).rstrip("/") != base:
                raise AuthConfigError(f"{url} names issuer {doc.get('issuer')!r}, not {issuer!r} "
                                      "(CONTROLPLANE_AUTH_ISSUER)")
            return str(doc["jwks_uri"])
    raise AuthConfigError(f"no jwks_uri found for issuer {issuer!r} at {' or '.join(candidates)}: "
                          "set CONTROLPLANE_AUTH_JWKS_URI")


class OAuthTokens(TokenVerifier):
    """Verifies access tokens (JWTs against the issuer's keys, opaque ones by introspection) and
    turns each into the caller it stands for (`CallerToken`), or None."""

    def __init__(self, settings: Settings, *, audience: str, jwks_uri: str | None = None,
                 static: dict[str, str] | None = None):
        super().__init__(required_scopes=[])  # scopes are per operation (Scopes.needed)
        # Static tokens (controlplane.mcp.auth) still work beside OAuth: their identities submit,
        # read and cancel their own tasks.
        self.static = static or {}
        if not settings.auth_issuer:
            raise AuthConfigError("CONTROLPLANE_AUTH_ISSUER is not set")
        self.issuer = settings.auth_issuer
        self.issuers = [self.issuer, *csv(settings.auth_issuer_aliases)]
        self.audiences = [audience, *csv(settings.auth_extra_audiences)]
        self.audience_claim = settings.auth_audience_claim
        self.leeway_s = settings.auth_leeway_s
        self.scopes = Scopes.of(settings)
        self.implicit_scopes = csv(settings.auth_implicit_scopes)
        self.required_claims = dict(pair.partition("=")[::2] for pair in csv(settings.auth_required_claims))
        self.team_claim = settings.auth_team_claim
        self.verified_cache_s = settings.auth_verified_cache_s
        self._verified: dict[str, tuple[float, CallerToken]] = {}  # token -> (trusted until, its caller)
        symmetric = settings.auth_algorithm.upper().startswith("HS")
        if symmetric and not settings.auth_hs_secret:
            raise AuthConfigError(f"CONTROLPLANE_AUTH_ALGORITHM={settings.auth_algorithm} is symmetric: it needs "
                                  "CONTROLPLANE_AUTH_HS_SECRET (and no JWKS)")
        self.jwt: JWTVerifier | None = None
        # `aud` is the verifier's to check; `client_id` (Cognito) is ours, below.
        verified_audience = self.audiences if self.audience_claim == "aud" else None
        if symmetric:
            self.jwt = JWTVerifier(public_key=settings.auth_hs_secret, issuer=self.issuers, audience=verified_audience,
                                   algorithm=settings.auth_algorithm)
        elif jwks_uri:
            self.jwt = JwksVerifier(jwks_uri=jwks_uri, issuer=self.issuers, audience=verified_audience,
                                    jwks_refresh_interval=settings.auth_jwks_refresh_s)
        self.introspection: IntrospectionTokenVerifier | None = None
        if settings.auth_introspection_url:
            if not (settings.auth_introspection_client_id and settings.auth_introspection_client_secret):
                raise AuthConfigError("CONTROLPLANE_AUTH_INTROSPECTION_URL needs "
                                      "CONTROLPLANE_AUTH_INTROSPECTION_CLIENT_ID and _CLIENT_SECRET")
            self.introspection = IntrospectionTokenVerifier(
                introspection_url=settings.auth_introspection_url, client_id=settings.auth_introspection_client_id,
                client_secret=settings.auth_introspection_client_secret,
                audience=self.audiences if self.audience_claim == "aud" else None,
                cache_ttl_seconds=settings.auth_introspection_cache_s or None)
        if self.jwt is None and self.introspection is None:
            raise AuthConfigError("no way to verify tokens: set CONTROLPLANE_AUTH_JWKS_URI (or let it be discovered), "
                                  "CONTROLPLANE_AUTH_HS_SECRET or CONTROLPLANE_AUTH_INTROSPECTION_URL")

    async def verify_token(self, token: str) -> CallerToken | None:
        now = time.time()
        hit = self._verified.get(token)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            found = await self._verify(token)
        except Exception:  # noqa: BLE001 - a verifier that breaks refuses; the log has why, never the token
            log.warning("token verification failed unexpectedly", exc_info=True)
            return None
        if found is not None and self.verified_cache_s > 0 and self.jwt is not None and _looks_like_jwt(token):
            # A JWT verified once is good until its exp: trust it again for a short while without
            # the signature check (most of what verification costs a call). Refusals are never kept.
            if len(self._verified) >= MAX_VERIFIED:
                self._verified = {t: v for t, v in self._verified.items() if v[0] > now}
                if len(self._verified) >= MAX_VERIFIED:
                    self._verified.clear()
            self._verified[token] = (min(now + self.verified_cache_s, found.expires_at or math.inf), found)
        return found

    async def _verify(self, token: str) -> CallerToken | None:
        if self.static:
            ident = self.static.get(digest(token))
            if ident is not None:
                return CallerToken(token=token, client_id=ident, scopes=self.scopes.own, caller=ident)
        jwt = self.jwt is not None and _looks_like_jwt(token)
        if jwt:
            assert self.jwt is not None
            found = await self.jwt.load_access_token(token)  # signature, alg, iss, aud, exp
        elif self.introspection is not None:
            found = await self.introspection.verify_token(token)  # active, aud, exp
        else:
            return None
        if found is None:
            return None
        claims: dict[str, Any] = dict(found.claims or {})
        why = self._refusal(claims, jwt)
        if why is not None:
            log.info("access token refused: %s", why)
            return None
        scopes = list(dict.fromkeys([*found.scopes, *self.implicit_scopes]))
        owner = owner_of(self.issuer, claims["sub"])
        teams = self._teams(claims)
        admin = self.scopes.admin in scopes
        caller: str = Caller(owner, teams=teams, admin=admin) if teams or admin else owner
        exp = claims.get("exp")
        return CallerToken(token=token, client_id=owner, scopes=scopes, subject=claims["sub"], claims=claims,
                           expires_at=int(exp) if isinstance(exp, int | float) else None, resource=self.audiences[0],
                           caller=caller)

    def _refusal(self, claims: dict[str, Any], jwt: bool) -> str | None:
        """Why a token that its verifier accepted is still refused, or None."""
        now = time.time()
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            return "no subject (sub)"
        exp = claims.get("exp")
        if jwt and not isinstance(exp, int | float):
            return "no expiry (exp)"
        if exp is not None and (not isinstance(exp, int | float) or not math.isfinite(exp) or exp <= now):
            return "expired"
        nbf = claims.get("nbf")
        if nbf is not None and (not isinstance(nbf, int | float) or not math.isfinite(nbf) or nbf > now + self.leeway_s):
            return "not valid yet (nbf)"
        iss = claims.get("iss")
        if (jwt or iss is not None) and iss not in self.issuers:
            return "issuer"
        if self.audience_claim != "aud" and claims.get(self.audience_claim) not in self.audiences:
            return f"audience ({self.audience_claim})"
        for name, value in self.required_claims.items():
            if str(claims.get(name)) != value:
                return f"claim {name}"
        return None

    def _teams(self, claims: dict[str, Any]) -> tuple[str, ...]:
        if not self.team_claim:
            return ()
        value = claims.get(self.team_claim)
        names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        return tuple(dict.fromkeys(team_of(self.issuer, v) for v in names if isinstance(v, str) and v))


# ---- the resource server ---------------------------------------------------------------------------
class McpOnlyBearer(BearerAuthBackend):
    """Reads bearer tokens on the MCP endpoint only: the runner callbacks and downloads carry
    credentials of their own (an attempt's secret), which must never reach a token verifier,
    let alone an introspection endpoint."""

    def __init__(self, verifier: TokenVerifier, path: str):
        super().__init__(verifier)
        self.path = path

    async def authenticate(self, conn: HTTPConnection) -> Any:
        path = conn.scope.get("path", "")
        if path != self.path and not path.startswith(self.path + "/"):
            return None
        return await super().authenticate(conn)


class ResourceServer(RemoteAuthProvider):
    """fastmcp's resource server (RFC 9728 metadata, 401 challenges) over `OAuthTokens`, with the
    metadata also at the root well-known form and tokens read on the MCP endpoint only."""

    def __init__(self, tokens: OAuthTokens, settings: Settings, *, base_url: str):
        servers = csv(settings.auth_authorization_servers) or [tokens.issuer]
        # As strings: the metadata model keeps a bare host's empty path ("https://idp.example.com"),
        # where AnyHttpUrl would add a "/" that no longer equals the issuer clients compare it with.
        super().__init__(token_verifier=tokens, authorization_servers=servers,  # type: ignore[arg-type]
                         base_url=base_url, scopes_supported=tokens.scopes.supported,
                         challenge_scopes=tokens.scopes.challenge, resource_name="mcp-controlplane")
        self.tokens = tokens
        self.resource_url = f"{base_url.rstrip('/')}{MCP_PATH}"  # the RFC 8707 resource: this MCP endpoint
        self.metadata_url = build_resource_metadata_url(AnyHttpUrl(self.resource_url))

    def get_routes(self, mcp_path: str | None = None) -> list[Route]:
        routes = super().get_routes(mcp_path)
        # MCP clients fall back to the root form when a challenge names no document; the same
        # document answers there (its `resource` is the MCP endpoint's URL).
        for route in list(routes):
            if isinstance(route, Route) and route.path.startswith(ROOT_METADATA_PATH + "/"):
                routes.append(Route(ROOT_METADATA_PATH, endpoint=route.endpoint, methods=route.methods))
                break
        return routes

    def get_middleware(self) -> list[Any]:
        return [Middleware(AuthenticationMiddleware, backend=McpOnlyBearer(self, MCP_PATH)),  # type: ignore[arg-type]  # verify_token as the SDK calls it
                Middleware(AuthContextMiddleware)]


def build_resource_server(settings: Settings, public_url: str) -> ResourceServer:
    """The OAuth resource server for an MCP endpoint at `<public_url>/mcp` (raises
    AuthConfigError naming the setting at fault)."""
    resource = f"{public_url.rstrip('/')}{MCP_PATH}"
    audience = settings.auth_audience or resource
    jwks_uri = settings.auth_jwks_uri
    symmetric = settings.auth_algorithm.upper().startswith("HS")
    if not jwks_uri and not symmetric and not settings.auth_introspection_url:
        jwks_uri = discover_jwks_uri(settings.auth_issuer or "")
    tokens = OAuthTokens(settings, audience=audience, jwks_uri=None if symmetric else jwks_uri,
                         static=load_tokens(settings))
    return ResourceServer(tokens, settings, base_url=public_url)


def build_auth(settings: Settings, public_url: str | None = None) -> AuthProvider | None:
    """The HTTP transport's auth: the OAuth resource server when an issuer is configured (static
    tokens are accepted beside it), else the static tokens (`controlplane.mcp.auth`), else none.
    OAuth needs the public URL (the MCP endpoint is the audience and the metadata's resource)."""
    if settings.oauth and public_url:
        return build_resource_server(settings, public_url)
    tokens = load_tokens(settings)
    return BearerTokens(tokens) if tokens else None


def caller_of(token: AccessToken | None) -> str | None:
    """The caller a verified token stands for (None without a token)."""
    if token is None:
        return None
    if isinstance(token, CallerToken) and token.caller is not None:
        return token.caller  # type: ignore[no-any-return]
    return token.client_id or None


__all__ = ["AuthConfigError", "CallerToken", "OAuthTokens", "ResourceServer", "Scopes", "build_auth",
           "build_resource_server", "caller_of", "discover_jwks_uri"]
