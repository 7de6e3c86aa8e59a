"""Bearer-token auth for the HTTP transport: each token maps to one caller identity.

Tokens come from `CONTROLPLANE_AUTH_TOKENS` ("token=identity,token2=identity2") and/or the file
named by `CONTROLPLANE_AUTH_TOKENS_FILE`, a TOML file:

    [tokens]
    "sha256:5e884898da28..." = "alice"   # store the SHA-256 of a token rather than the token
    "plain-token-for-dev" = "bob"

Tokens are looked up by their SHA-256. The identity becomes the owner of every
task the caller submits; a caller only ever sees its own tasks. OAuth access tokens from an
identity provider are `controlplane.mcp.oauth`'s, which also chooses between the two
(`build_auth`); static tokens keep working beside OAuth.
"""

from __future__ import annotations

import hashlib
import tomllib

from fastmcp.server.auth.auth import AccessToken, TokenVerifier

from controlplane.settings import Settings


class TokenFileError(ValueError):
    pass


MAX_IDENTITY = 200  # characters of the store's owner column (PostgreSQL refuses more)


def _identity(ident: object, where: str) -> str:
    """An identity as the store keeps it as the owner of tasks: 1 to 200 printable characters."""
    if not isinstance(ident, str) or not ident:
        raise TokenFileError(f"{where}: identity must be a string")
    if len(ident) > MAX_IDENTITY or not ident.isprintable():
        raise TokenFileError(f"{where}: identity must be at most {MAX_IDENTITY} printable characters")
    return ident


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(settings: Settings) -> dict[str, str]:
    """{sha256(token): identity}"""
    out: dict[str, str] = {}
    if settings.auth_tokens:
        for pair in settings.auth_tokens.split(","):
            token, sep, ident = pair.strip().partition("=")
            if not sep or not token or not ident:
                raise TokenFileError("CONTROLPLANE_AUTH_TOKENS must be 'token=identity,...'")
            out[digest(token)] = _identity(ident, "CONTROLPLANE_AUTH_TOKENS")
    if settings.auth_tokens_file:
        try:
            data = tomllib.loads(settings.auth_tokens_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise TokenFileError(f"{settings.auth_tokens_file}: cannot read tokens: {e}") from None
        table = data.get("tokens")
        if not isinstance(table, dict):
            raise TokenFileError(f"{settings.auth_tokens_file}: expected a [tokens] table")
        for token, ident in table.items():
            ident = _identity(ident, f"{settings.auth_tokens_file}: tokens.{token[:8]}...")
            out[token.removeprefix("sha256:").lower() if token.startswith("sha256:") else digest(token)] = ident
    return out


class BearerTokens(TokenVerifier):
    def __init__(self, digests: dict[str, str]):
        super().__init__()
        self._digests = digests

    async def verify_token(self, token: str) -> AccessToken | None:
        ident = self._digests.get(digest(token))  # a digest lookup leaks nothing about the token
        if ident is None:
            return None
        return AccessToken(token=token, client_id=ident, scopes=[], expires_at=None)
