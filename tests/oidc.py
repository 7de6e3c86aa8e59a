"""A throwaway OpenID provider for the tests, served over HTTP on 127.0.0.1 by a small real server
(the standard library's): discovery, a JWKS that the test can rotate, and RFC 7662 introspection
of the opaque tokens it hands out. Its keys are made here (`cryptography`), and it signs the
tokens the tests present, good ones and every kind of bad one, attacks included (`alg: none`,
HS256 with the public key as the secret), crafted by hand so that nothing refuses to make them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

INTROSPECTION_CLIENT = ("controlplane", "introspection-secret")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int(n: int) -> str:
    return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))


HASHES = {"256": hashes.SHA256, "384": hashes.SHA384, "512": hashes.SHA512}
CURVES = {"ES256": (ec.SECP256R1, "P-256", 32), "ES384": (ec.SECP384R1, "P-384", 48),
          "ES512": (ec.SECP521R1, "P-521", 66)}


class Key:
    """A signing key for `alg` (RS*, PS*: RSA; ES*: EC on its curve; EdDSA: Ed25519, or Ed448 with
    `curve`), its public JWK (declaring `alg` unless `declare_alg` is False) and its PEM."""

    def __init__(self, kid: str, alg: str = "RS256", *, declare_alg: bool = True, curve: str = "Ed25519",
                 use: str = "sig"):
        self.kid, self.alg = kid, alg
        self.private: Any
        if alg[:2] in ("RS", "PS"):
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            numbers = self.private.public_key().public_numbers()
            self.jwk = {"kty": "RSA", "n": _int(numbers.n), "e": _int(numbers.e)}
        elif alg in CURVES:
            curve_cls, crv, size = CURVES[alg]
            self.private = ec.generate_private_key(curve_cls())
            point = self.private.public_key().public_numbers()
            self.jwk = {"kty": "EC", "crv": crv, "x": b64url(point.x.to_bytes(size, "big")),
                        "y": b64url(point.y.to_bytes(size, "big"))}
        elif alg == "EdDSA":
            self.private = (ed25519.Ed25519PrivateKey if curve == "Ed25519" else ed448.Ed448PrivateKey).generate()
            raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            self.jwk = {"kty": "OKP", "crv": curve, "x": b64url(raw)}
        else:
            raise ValueError(alg)
        self.jwk = {**self.jwk, "kid": kid, "use": use, **({"alg": alg} if declare_alg else {})}
        self.public_pem = self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def sign(self, signing_input: bytes, alg: str | None = None) -> bytes:
        """A JWS signature of `signing_input` with `alg` (default: the key's own)."""
        alg = alg or self.alg
        if alg.startswith("RS"):
            return self.private.sign(signing_input, padding.PKCS1v15(), HASHES[alg[2:]]())
        if alg.startswith("PS"):
            digest = HASHES[alg[2:]]()
            return self.private.sign(signing_input, padding.PSS(padding.MGF1(digest), digest.digest_size), digest)
        if alg.startswith("ES"):  # JWS wants r || s, each the curve's size (RFC 7518 3.4), not DER
            r, s = decode_dss_signature(self.private.sign(signing_input, ec.ECDSA(HASHES[alg[2:]]())))
            size = CURVES[alg][2]
            return r.to_bytes(size, "big") + s.to_bytes(size, "big")
        return self.private.sign(signing_input)  # EdDSA


class FakeIdP:
    """`issuer` is its URL; `keys` are published in its JWKS (`publish`, `rotate`)."""

    def __init__(self) -> None:
        self.keys: dict[str, Key] = {}
        self.published: list[str] = []
        self.jwks_fetches = 0
        self.introspected: list[str] = []  # every token it was asked about
        self.opaque: dict[str, dict[str, Any]] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.issuer = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.rotate()

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> FakeIdP:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def jwks_uri(self) -> str:
        return f"{self.issuer}/jwks"

    @property
    def introspection_url(self) -> str:
        return f"{self.issuer}/introspect"

    def rotate(self, alg: str = "RS256", *, keep_old: bool = False, **kw: Any) -> Key:
        """A new signing key for `alg` (`Key`'s options in `kw`), published; the old ones
        withdrawn unless `keep_old`."""
        key = Key(f"k{len(self.keys) + 1}-{secrets.token_hex(3)}", alg, **kw)
        self.keys[key.kid] = key
        self.published = [*self.published, key.kid] if keep_old else [key.kid]
        return key

    @property
    def current(self) -> Key:
        return self.keys[self.published[-1]]

    # ---- tokens ---------------------------------------------------------------------------------
    def claims(self, sub: str, *, audience: str | list[str] | None, scopes: list[str] | None = None,
               lifetime_s: float = 600, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        # A jti of its own, as identity providers give: RS256 signs deterministically, and two tokens
        # with the same claims in the same second would be the same bytes (one already verified).
        out: dict[str, Any] = {"iss": self.issuer, "sub": sub, "iat": now, "exp": now + int(lifetime_s),
                               "jti": secrets.token_hex(8)}
        if audience is not None:
            out["aud"] = audience
        if scopes is not None:
            out["scope"] = " ".join(scopes)
        out.update(extra)
        return {k: v for k, v in out.items() if v is not None}

    def token(self, sub: str = "alice", *, audience: str | list[str] | None, scopes: list[str] | None = None,
              key: Key | None = None, header: dict[str, Any] | None = None, **claims: Any) -> str:
        """A JWT signed by `key` (default: the newest published key) with the algorithm of its
        header (default: the key's own)."""
        key = key or self.current
        head = {"alg": key.alg, "typ": "JWT", "kid": key.kid, **(header or {})}
        return self.sign(head, self.claims(sub, audience=audience, scopes=scopes, **claims), key)

    @staticmethod
    def encode(header: dict[str, Any], claims: dict[str, Any]) -> bytes:
        return (b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())).encode()

    def sign(self, header: dict[str, Any], claims: dict[str, Any], key: Key, alg: str | None = None) -> str:
        """Signed by `key` with `alg` (default: the key's own, whatever the header says)."""
        signing_input = self.encode(header, claims)
        return signing_input.decode() + "." + b64url(key.sign(signing_input, alg))

    def unsigned(self, sub: str = "alice", *, audience: str, scopes: list[str]) -> str:
        """`alg: none`: no signature at all."""
        header = {"alg": "none", "typ": "JWT", "kid": self.current.kid}
        return self.encode(header, self.claims(sub, audience=audience, scopes=scopes)).decode() + "."

    def hs256_with_public_key(self, sub: str = "alice", *, audience: str, scopes: list[str],
                              key: Key | None = None, secret: bytes | None = None) -> str:
        """The algorithm-confusion attack: HS256 with a published public key (`key`'s, default the
        newest; its PEM unless `secret` gives another form of it) as the HMAC secret."""
        key = key or self.current
        header = {"alg": "HS256", "typ": "JWT", "kid": key.kid}
        signing_input = self.encode(header, self.claims(sub, audience=audience, scopes=scopes))
        mac = hmac.new(key.public_pem if secret is None else secret, signing_input, hashlib.sha256).digest()
        return signing_input.decode() + "." + b64url(mac)

    def opaque_token(self, sub: str = "alice", *, audience: str, scopes: list[str], active: bool = True,
                     **extra: Any) -> str:
        token = "opaque-" + secrets.token_urlsafe(24)
        self.opaque[token] = {"active": active, "client_id": "agent", "token_type": "Bearer",
                              **self.claims(sub, audience=audience, scopes=scopes, **extra)}
        return token

    # ---- the HTTP side --------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _json(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/.well-known/openid-configuration":
                    self._json(200, {"issuer": idp.issuer, "jwks_uri": idp.jwks_uri,
                                     "authorization_endpoint": f"{idp.issuer}/authorize",
                                     "token_endpoint": f"{idp.issuer}/token",
                                     "introspection_endpoint": idp.introspection_url,
                                     "response_types_supported": ["code"], "subject_types_supported": ["public"],
                                     "id_token_signing_alg_values_supported": ["RS256"]})
                elif self.path == "/jwks":
                    idp.jwks_fetches += 1
                    self._json(200, {"keys": [idp.keys[k].jwk for k in idp.published]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                if self.path != "/introspect":
                    self._json(404, {"error": "not found"})
                    return
                expected = "Basic " + base64.b64encode(":".join(INTROSPECTION_CLIENT).encode()).decode()
                if self.headers.get("authorization") != expected:
                    self._json(401, {"error": "invalid_client"})
                    return
                token = form.get("token", [""])[0]
                idp.introspected.append(token)
                self._json(200, idp.opaque.get(token, {"active": False}))

        return Handler
