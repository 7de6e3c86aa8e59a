"""GCS links signed through IAM Credentials signBlob, as on Cloud Run (no private key at hand).

A fake IAM Credentials server on 127.0.0.1 holds an RSA key made here and answers signBlob;
the GCS emulator holds the objects (it does not check signatures, so each signature is checked
here against the fake's public key, by rebuilding the V4 canonical request).
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

pytest.importorskip("google.cloud.storage")

from google.auth import credentials as auth_credentials  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402
from google.cloud import storage  # noqa: E402
from google.oauth2.credentials import Credentials as TokenCredentials  # noqa: E402

from controlplane.objectstore.gcs import (  # noqa: E402
    DEFAULT_IAM_ENDPOINT,
    GcsObjectStore,
    GcsSigningError,
    IamSignBlobSigner,
)
from tests.cloud import gcs_emulator  # noqa: E402
from tests.test_cloud_stores import verify_gcs_v4  # noqa: E402

TOKEN = "test-token"
SIGNER = "runner@controlplane-test.iam.gserviceaccount.com"
SEVEN_DAYS = 7 * 24 * 3600
PROJECT = "controlplane-test"


# ---- a fake IAM Credentials API -------------------------------------------------------------
@dataclass
class FakeIam:
    url: str
    private_pem: str
    key_id: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)  # statuses to answer first, one per call
    always: int | None = None  # a status to answer every call with

    def service_account(self, email: str = SIGNER) -> dict[str, str]:
        """What verify_gcs_v4 takes: the key the fake signs with, and the account it signs as."""
        return {"private_key": self.private_pem, "client_email": email}


@pytest.fixture
def iam() -> Iterator[FakeIam]:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    prefix, suffix = "/v1/projects/-/serviceAccounts/", ":signBlob"
    fake: FakeIam

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            auth = self.headers.get("Authorization", "")
            call = {"path": self.path, "authorization": auth, "body": raw}
            fake.calls.append(call)
            if not (self.path.startswith(prefix) and self.path.endswith(suffix)):
                return self.answer(404, {"error": {"code": 404, "message": "not found"}})
            if auth != f"Bearer {TOKEN}":
                return self.answer(401, {"error": {"code": 401, "message": "bad credentials"}})
            status = fake.fail_next.pop(0) if fake.fail_next else fake.always
            if status is not None:
                # echoes what it was sent, as a careless proxy might: the client must not repeat it
                return self.answer(status, {"error": {"code": status, "message": f"try later ({auth})"}})
            payload = base64.b64decode(json.loads(raw)["payload"])
            call["payload"] = payload
            signature = key.sign(payload, padding.PKCS1v15(), hashes.SHA256())
            self.answer(200, {"keyId": fake.key_id, "signedBlob": base64.b64encode(signature).decode()})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    fake = FakeIam(f"http://127.0.0.1:{server.server_address[1]}", pem, secrets.token_hex(8))
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# ---- the GCS emulator, and a store whose credentials hold no private key ----------------------
@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with gcs_emulator() as url:
        yield url


@pytest.fixture
def bucket(emulator: str, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"cp-{secrets.token_hex(6)}"
    storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                   client_options={"api_endpoint": emulator}).create_bucket(name)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    for var in ("CONTROLPLANE_GCS_SIGNING_KEY_FILE", "CONTROLPLANE_GCS_IAM_ENDPOINT", "CONTROLPLANE_GCS_SIGNER_EMAIL"):
        monkeypatch.delenv(var, raising=False)
    return name


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(IamSignBlobSigner, "backoff_s", 0.01)


class MetadataCredentials(auth_credentials.Credentials):
    """Like Cloud Run's metadata-server credentials: a token and an email, no private key; the
    email reads "default" until the first refresh."""

    def __init__(self) -> None:
        super().__init__()
        self._email = "default"
        self.refreshes = 0

    @property
    def service_account_email(self) -> str:
        return self._email

    def refresh(self, request: Any) -> None:
        self.refreshes += 1
        self.token = TOKEN
        self.expiry = datetime.now(UTC).replace(tzinfo=None) + timedelta(hours=1)
        self._email = SIGNER


def token_client(creds: Any = None) -> storage.Client:
    return storage.Client(project=PROJECT, credentials=creds or TokenCredentials(token=TOKEN))


def signed_at(q: dict[str, str]) -> float:
    return datetime.strptime(q["X-Goog-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()


# ---- the tests --------------------------------------------------------------------------------
def test_link_is_signed_by_signblob_at_the_configured_endpoint(bucket: str, iam: FakeIam,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_GCS_IAM_ENDPOINT", iam.url + "/")
    monkeypatch.setenv("CONTROLPLANE_GCS_SIGNER_EMAIL", SIGNER)
    creds = TokenCredentials(token=TOKEN)
    assert not hasattr(creds, "sign_bytes")  # nothing to sign with locally
    store = GcsObjectStore(bucket, "runs", client=token_client(creds))
    assert store.iam_endpoint == iam.url
    payload = b"\x00\x01artifact bytes\xff" * 1000
    key = "t/attempts/1/artifacts/out/result.bin"
    store.put_bytes(key, payload)

    url = store.signed_url(key, expires_in=300, filename="result.bin")
    assert len(iam.calls) == 1
    call = iam.calls[0]
    assert call["authorization"] == f"Bearer {TOKEN}"
    assert call["path"] == f"/v1/projects/-/serviceAccounts/{SIGNER}:signBlob"
    assert call["payload"].startswith(b"GOOG4-RSA-SHA256\n")  # the storage library built the string to sign
    q = verify_gcs_v4(url, iam.service_account())  # the signature checks out against the fake's key
    assert q["X-Goog-Credential"].startswith(f"{SIGNER}/")
    assert q["X-Goog-Expires"] == "300" and abs(signed_at(q) - time.time()) < 60
    assert TOKEN not in url

    r = httpx.get(url)
    assert r.status_code == 200 and r.content == payload
    assert 'filename="result.bin"' in r.headers["content-disposition"]

    # a month asked for, seven days given, and still signed by IAM
    q = verify_gcs_v4(store.signed_url(key, expires_in=30 * 86400, filename="x"), iam.service_account())
    assert int(q["X-Goog-Expires"]) == SEVEN_DAYS
    assert len(iam.calls) == 2


def test_constructor_arguments_and_runtime_identity(bucket: str, iam: FakeIam) -> None:
    """Settings may come as arguments; the signer defaults to the runtime identity's own email,
    read after a refresh (metadata credentials say "default" before)."""
    creds = MetadataCredentials()
    store = GcsObjectStore(bucket, client=token_client(creds), iam_endpoint=iam.url)
    store.put_bytes("a/b.txt", b"hello")
    creds.token, creds.expiry = None, None  # as if the token had never been fetched
    url = store.signed_url("a/b.txt", expires_in=60, filename="b.txt")
    assert creds.refreshes >= 1 and creds.service_account_email == SIGNER
    assert iam.calls[-1]["authorization"] == f"Bearer {TOKEN}"
    assert iam.calls[-1]["path"] == f"/v1/projects/-/serviceAccounts/{SIGNER}:signBlob"
    verify_gcs_v4(url, iam.service_account())
    assert httpx.get(url).content == b"hello"


def test_throttling_and_server_errors_are_retried(bucket: str, iam: FakeIam) -> None:
    store = GcsObjectStore(bucket, client=token_client(), iam_endpoint=iam.url, signer_email=SIGNER)
    store.put_bytes("k.bin", b"data")
    iam.fail_next = [429, 503]
    url = store.signed_url("k.bin", expires_in=60, filename="k.bin")
    assert len(iam.calls) == 3
    verify_gcs_v4(url, iam.service_account())
    assert httpx.get(url).content == b"data"


def test_an_endpoint_that_keeps_failing_gives_a_clear_error(bucket: str, iam: FakeIam) -> None:
    store = GcsObjectStore(bucket, client=token_client(), iam_endpoint=iam.url, signer_email=SIGNER)
    iam.always = 503
    with pytest.raises(GcsSigningError) as info:
        store.signed_url("k.bin", expires_in=60, filename="k.bin")
    message = str(info.value)
    assert "signBlob" in message and SIGNER in message and "503" in message and iam.url in message
    assert "<token>" in message  # the fake echoed the header; the message blanked it
    assert TOKEN not in "".join(traceback.format_exception(info.value))
    assert len(iam.calls) == IamSignBlobSigner.attempts


def test_a_refusal_is_not_retried_and_says_what_is_missing(bucket: str, iam: FakeIam) -> None:
    store = GcsObjectStore(bucket, client=token_client(), iam_endpoint=iam.url, signer_email=SIGNER)
    iam.always = 403
    with pytest.raises(GcsSigningError, match="serviceAccountTokenCreator") as info:
        store.signed_url("k.bin", expires_in=60, filename="k.bin")
    assert TOKEN not in str(info.value)
    assert len(iam.calls) == 1


def test_unreachable_endpoint_and_missing_signer(bucket: str, iam: FakeIam) -> None:
    from tests.cloud import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    store = GcsObjectStore(bucket, client=token_client(), iam_endpoint=dead, signer_email=SIGNER)
    with pytest.raises(GcsSigningError, match="unreachable") as info:
        store.signed_url("k.bin", expires_in=60, filename="k.bin")
    assert TOKEN not in str(info.value)

    # token credentials name no service account, and none is configured
    store = GcsObjectStore(bucket, client=token_client(), iam_endpoint=iam.url)
    with pytest.raises(GcsSigningError, match="CONTROLPLANE_GCS_SIGNER_EMAIL"):
        store.signed_url("k.bin", expires_in=60, filename="k.bin")
    assert iam.calls == []


def test_default_endpoint(bucket: str) -> None:
    store = GcsObjectStore(bucket, client=token_client())
    assert store.iam_endpoint == DEFAULT_IAM_ENDPOINT == "https://iamcredentials.googleapis.com"
    assert store.signer_email is None


def test_an_upload_grant_is_signed_by_signblob_too(bucket: str, iam: FakeIam, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job without credentials uploads with a PUT signed the same way as links (Cloud Run's
    control plane holds no key)."""
    monkeypatch.setenv("CONTROLPLANE_GCS_IAM_ENDPOINT", iam.url)
    monkeypatch.setenv("CONTROLPLANE_GCS_SIGNER_EMAIL", SIGNER)
    store = GcsObjectStore(bucket, "runs", client=token_client())
    put = store.signed_put("t/attempts/1/result.json", expires_in=600)
    assert len(iam.calls) == 1 and iam.calls[0]["payload"].startswith(b"GOOG4-RSA-SHA256\n")
    q = verify_gcs_v4(put.url, iam.service_account(), "PUT", put.headers)
    assert q["X-Goog-Credential"].startswith(f"{SIGNER}/") and q["X-Goog-Expires"] == "600"
    r = httpx.put(put.url, content=b"{}", headers={**put.headers, "Content-Type": "application/octet-stream"})
    assert r.status_code == 200 and store.get_bytes("t/attempts/1/result.json") == b"{}"
