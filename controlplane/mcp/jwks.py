"""JWTs checked against the issuer's JWKS with the algorithm each key is for.

fastmcp's `JWTVerifier` takes one algorithm and drops the keys of other types, so an issuer that
signs with an EC or Ed25519 key (or rotates from RSA to EC) is refused. `JwksVerifier` keeps
fastmcp's fetching, caching and refresh limits, and reads each JWK's algorithms from the key
itself (docs/design/authorization.md):

* a key that declares `alg` is good for that algorithm only, and only if it is an asymmetric one
  of the key's type; a key without `alg` is good for its type's: RSA for RS256/384/512 and
  PS256/384/512, EC for the one ES* of its curve, OKP (Ed25519, Ed448) for EdDSA and its
  curve's name;
* a token is verified only with an algorithm its key is good for: `none`, any HMAC algorithm
  (which would take the public key for a secret), and an algorithm of another key type are
  refused, as are keys meant for encryption (`use: enc`) and tokens with `crit` headers.

The claims it checks are `iss`, `aud` and `exp`; `controlplane.mcp.oauth.OAuthTokens` adds the rest.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx2
from fastmcp.server.auth import AccessToken
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.server.auth.ssrf import SSRFError, SSRFFetchError
from fastmcp.utilities.auth import decode_jwt_header
from joserfc import jwk, jwt
from joserfc.errors import JoseError
from joserfc.jws import JWSRegistry

RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
EC_ALGORITHMS = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
OKP_CURVES = frozenset({"Ed25519", "Ed448"})


def algorithms_of(key: dict[str, Any]) -> frozenset[str]:
    """The signing algorithms a JWK is good for (none for a key that signs nothing we accept)."""
    kty, declared = key.get("kty"), key.get("alg")
    if key.get("use", "sig") != "sig":
        return frozenset()
    if kty == "RSA":
        allowed = RSA_ALGORITHMS
    elif kty == "EC" and key.get("crv") in EC_ALGORITHMS:
        allowed = frozenset({EC_ALGORITHMS[key["crv"]]})
    elif kty == "OKP" and key.get("crv") in OKP_CURVES:
        allowed = frozenset({"EdDSA", key["crv"]})
    else:
        return frozenset()
    if declared is None:
        return allowed
    return frozenset({declared}) & allowed


@dataclass(frozen=True)
class _Key:
    key: Any  # a joserfc key
    algorithms: frozenset[str]


class JwksVerifier(JWTVerifier):
    """A `JWTVerifier` over a JWKS whose keys each bring their algorithms (see the module)."""

    def __init__(self, *, jwks_uri: str, issuer: list[str], audience: list[str] | None,
                 jwks_refresh_interval: float):
        super().__init__(jwks_uri=jwks_uri, issuer=issuer, audience=audience, jwks_refresh_interval=jwks_refresh_interval)

    async def _refresh_jwks_key(self, kid: str | None) -> Any:
        """Read the key set again (under fastmcp's refresh lock and rate limit) and return the
        key `kid` names (or the only one)."""
        try:
            doc = await self._fetch_jwks()
        except (SSRFError, SSRFFetchError, httpx2.HTTPError, json.JSONDecodeError, ValueError) as e:
            raise ValueError(f"Failed to fetch JWKS: {type(e).__name__}") from None
        keys: dict[str, _Key] = {}
        for data in doc.get("keys", []) if isinstance(doc, dict) else []:
            algorithms = algorithms_of(data) if isinstance(data, dict) else frozenset()
            if not algorithms:
                continue  # RFC 7517 5: a key we cannot use is ignored, not fatal to the set
            try:
                key = jwk.import_key(data, data["kty"])
            except (JoseError, TypeError, KeyError, ValueError):
                continue
            keys[data.get("kid") or "_default"] = _Key(key, algorithms)
        self._jwks_cache = keys  # type: ignore[assignment]  # (kid -> _Key, not PEM text)
        self._jwks_cache_time = time.monotonic()
        if kid:
            if kid not in keys:
                raise ValueError("key id not in the JWKS")
            return keys[kid]
        if len(keys) != 1:
            raise ValueError("no kid, and the JWKS does not have exactly one key")
        return next(iter(keys.values()))

    async def load_access_token(self, token: str) -> AccessToken | None:
        try:
            header = decode_jwt_header(token)
            alg = header.get("alg")
            if "crit" in header:
                return None  # no critical extension is understood here
            found: _Key = await self._get_verification_key(token)  # type: ignore[assignment]
            if not isinstance(alg, str) or alg not in found.algorithms:
                self.logger.info("Bearer token refused: algorithm %r is not one its key is for", alg)
                return None
            claims = jwt.decode(token, found.key, algorithms=[alg],
                                registry=JWSRegistry(algorithms=[alg], strict_check_header=False)).claims
        except (JoseError, ValueError, TypeError, KeyError, AttributeError):
            return None
        exp = claims.get("exp")
        if isinstance(exp, int | float) and exp < time.time():
            return None
        if not self._validate_issuer(claims.get("iss")):
            return None
        if self.audience is not None:
            wanted = self.audience if isinstance(self.audience, list) else [self.audience]
            aud = claims.get("aud")
            if not any(a in wanted for a in (aud if isinstance(aud, list) else [aud]) if isinstance(a, str)):
                return None
        client_id = claims.get("client_id") or claims.get("azp") or claims.get("sub") or "unknown"
        return AccessToken(token=token, client_id=str(client_id), scopes=self._extract_scopes(claims),
                           expires_at=int(exp) if isinstance(exp, int | float) else None,
                           subject=claims.get("sub"), claims=claims)
