"""Dashboard sessions: a browser signs in once with a bearer token and then holds a signed
session cookie, never the token.

Why a cookie: the dashboard follows a task over server-sent events, and a browser's EventSource
cannot send an Authorization header; a token in a URL would end up in history, proxies and logs.
So the sign-in form POSTs the token once (in the body of a plain form submission),
the server verifies it exactly as the MCP endpoint does (the same verifier, static tokens and
OAuth alike) and answers with a cookie that carries who the caller is and what it may do (owner,
teams, admin, read, cancel) and when that ends, signed with an HMAC of the server's key: any
replica sharing CONTROLPLANE_SECRET_KEY accepts it, nothing is stored. The cookie is HttpOnly
(no script reads it), SameSite=Strict (no other site's page sends it), Path=/dashboard, Secure on
an https public URL, and it expires after CONTROLPLANE_DASHBOARD_SESSION_S or at the OAuth token's
own `exp`, whichever comes first. The token itself is kept nowhere; a revoked token's session
lasts until the cookie expires (sign-in is checked again only then).

Writes (cancel) also need a CSRF token: an HMAC of the session's nonce, put in the page and sent
back in an `X-CSRF-Token` header, which no cross-site form can set (and the app's Host/Origin
guard refuses other origins before any route runs).

Hand-written on the standard library's hmac (as the signed download links are) rather than
itsdangerous, which would be a new dependency for these few lines.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from controlplane.identity import Caller

COOKIE = "cp_dashboard"


@dataclass(frozen=True)
class Session:
    owner: str
    teams: tuple[str, ...]
    admin: bool
    read: bool
    cancel: bool
    expires: float
    nonce: str

    @property
    def caller(self) -> str:
        """The caller as the service takes it (`controlplane.identity`)."""
        return Caller(self.owner, teams=self.teams, admin=self.admin) if self.teams or self.admin else self.owner


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    def __init__(self, secret_key: bytes, lifetime_s: float):
        self.key = hmac.new(secret_key, b"controlplane dashboard session", hashlib.sha256).digest()
        self.lifetime_s = lifetime_s

    def _sign(self, text: str) -> str:
        return _b64(hmac.new(self.key, text.encode(), hashlib.sha256).digest())

    def issue(self, owner: str, *, teams: tuple[str, ...] = (), admin: bool = False, read: bool = True,
              cancel: bool = True, not_after: float | None = None) -> tuple[Session, str]:
        """A new session and its cookie value."""
        expires = time.time() + self.lifetime_s
        if not_after is not None:
            expires = min(expires, not_after)
        s = Session(owner, tuple(teams), admin, read, cancel, expires, secrets.token_urlsafe(16))
        payload = _b64(json.dumps([s.owner, list(s.teams), s.admin, s.read, s.cancel, s.expires, s.nonce]).encode())
        return s, f"{payload}.{self._sign(payload)}"

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie carries, if it is ours, intact and not expired."""
        if not cookie or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            owner, teams, admin, read, cancel, expires, nonce = json.loads(_unb64(payload))
            s = Session(str(owner), tuple(str(t) for t in teams), bool(admin), bool(read), bool(cancel),
                        float(expires), str(nonce))
        except (ValueError, TypeError):
            return None
        return s if s.expires > time.time() else None

    def csrf(self, session: Session) -> str:
        return self._sign("csrf:" + session.nonce)

    def csrf_ok(self, session: Session, header: str | None) -> bool:
        return bool(header) and hmac.compare_digest(header or "", self.csrf(session))
