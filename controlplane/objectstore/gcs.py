"""Google Cloud Storage through google-cloud-storage: `gs://bucket/prefix`.

Credentials come from Application Default Credentials (the job's service account on Cloud
Run); `STORAGE_EMULATOR_HOST` points the client at an emulator. Writes stream through a
resumable upload in 8 MiB chunks with `ifGenerationMatch=0` (GCS refuses a second write of the
same name atomically; the store also checks first, for emulators that do not enforce it).

Links are V4 signed URLs, at most 7 days. They are signed with a service-account key when
`CONTROLPLANE_GCS_SIGNING_KEY_FILE` names one (or when the client's own credentials hold a
private key), and otherwise through IAM Credentials signBlob with the runtime identity (Cloud
Run's metadata credentials carry no private key), which needs the identity to hold
roles/iam.serviceAccountTokenCreator on the signing service account:

- `CONTROLPLANE_GCS_IAM_ENDPOINT`: where signBlob is called (default
  `https://iamcredentials.googleapis.com`, or `https://iamcredentials.<universe>` in another
  universe), e.g. a private endpoint or, in tests, a fake;
- `CONTROLPLANE_GCS_SIGNER_EMAIL`: the service account to sign as (default the runtime
  credentials' `service_account_email`).

Either way google-cloud-storage builds the canonical request; only the RSA signature of the
string to sign comes from IAM. The access token is sent to the IAM endpoint only, and never
logged or put in an error.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

import requests
from google.api_core import exceptions as gexc
from google.auth import credentials as auth_credentials
from google.auth import crypt
from google.cloud import storage  # type: ignore[attr-defined]  # google-cloud-storage ships no types
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from controlplane.objectstore.base import (
    CHUNK,
    ObjectExists,
    ObjectInfo,
    ObjectStore,
    SignedRequest,
    UploadIncomplete,
    check_key,
    content_disposition,
    join_key,
    split_store_url,
)

UPLOAD_CHUNK = 8 * CHUNK  # a multiple of 256 KiB, as resumable uploads require
RESUMABLE_UNIT = 256 * 1024
DEFAULT_IAM_ENDPOINT = "https://iamcredentials.googleapis.com"

log = logging.getLogger("controlplane.objectstore.gcs")


class GcsSigningError(RuntimeError):
    """A link could not be signed (IAM signBlob refused, unreachable, or no signer configured)."""


class _TransientSignBlobError(GcsSigningError):
    """429, 5xx or a connection failure: worth another try."""


class IamSignBlobSigner(crypt.Signer, auth_credentials.Signing):
    """Signs bytes with IAM Credentials `signBlob`, at an endpoint of our choosing.

    Hand-written because the libraries hard-code the endpoint: google-cloud-storage's
    `_signing._sign_message` (used for `service_account_email=` + `access_token=`) POSTs to
    `https://iamcredentials.{universe_domain}/...`, and `google.auth.iam.Signer` and
    `impersonated_credentials.Credentials.sign_bytes` use the module constant
    `google.auth.iam._IAM_SIGN_ENDPOINT` (only the universe domain is substituted). Neither can
    be pointed at a private endpoint or a fake without patching module globals.

    It is both a `google.auth.crypt.Signer` (`sign`, `key_id`) and a
    `google.auth.credentials.Signing` (`sign_bytes`, `signer_email`, `signer`), so it can be
    passed as `credentials=` to `Blob.generate_signed_url(version="v4")`, which then builds the
    canonical request and string to sign itself and only asks us for the RSA signature.
    """

    attempts = 4  # 429 and 5xx are retried, waiting backoff_s, 2x, 4x... (at most 8 s) between tries
    backoff_s = 0.5
    timeout_s = 30.0

    def __init__(self, credentials: Any, endpoint: str, signer_email: str | None = None, *,
                 attempts: int | None = None, backoff_s: float | None = None, timeout_s: float | None = None,
                 session: requests.Session | None = None):
        self._credentials = credentials  # the runtime identity; its token authorizes the call
        self.endpoint = endpoint.rstrip("/")
        self._email = signer_email
        if attempts is not None:
            self.attempts = max(1, int(attempts))
        if backoff_s is not None:
            self.backoff_s = backoff_s
        if timeout_s is not None:
            self.timeout_s = timeout_s
        self._session = session or requests.Session()
        self._lock = threading.Lock()

    # ---- google.auth.credentials.Signing ---------------------------------------------------
    @property
    def signer_email(self) -> str:
        if not self._email:
            # Metadata-server credentials say "default" until their first refresh.
            self._ensure_valid()
            email = getattr(self._credentials, "service_account_email", None)
            if not email or email == "default":
                raise GcsSigningError(
                    "cannot sign a GCS link: no service-account key (CONTROLPLANE_GCS_SIGNING_KEY_FILE) and the "
                    "runtime credentials name no service account; set CONTROLPLANE_GCS_SIGNER_EMAIL")
            self._email = email
        return self._email

    @property
    def signer(self) -> IamSignBlobSigner:
        return self

    def sign_bytes(self, message: bytes | str) -> bytes:
        return self.sign(message)

    # ---- google.auth.crypt.Signer --------------------------------------------------------------
    @property
    def key_id(self) -> str | None:
        return None  # IAM picks the key; it names it in the answer's keyId

    def sign(self, message: bytes | str) -> bytes:
        if isinstance(message, str):
            message = message.encode("utf-8")
        email = self.signer_email
        url = f"{self.endpoint}/v1/projects/-/serviceAccounts/{quote(email, safe='@')}:signBlob"
        body = {"payload": base64.b64encode(message).decode("ascii")}
        try:
            for attempt in Retrying(stop=stop_after_attempt(self.attempts),
                                    wait=wait_exponential(multiplier=self.backoff_s, max=8),
                                    retry=retry_if_exception_type(_TransientSignBlobError), reraise=True):
                with attempt:
                    return self._call(url, body, email)
        except _TransientSignBlobError as exc:
            raise GcsSigningError(f"IAM signBlob for {email} at {url} failed after {self.attempts} attempts: "
                                  f"{exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- the call --------------------------------------------------------------------------
    def _ensure_valid(self) -> None:
        import google.auth.exceptions
        import google.auth.transport.requests

        with self._lock:
            if self._credentials.valid:
                return
            try:
                self._credentials.refresh(google.auth.transport.requests.Request(self._session))
            except google.auth.exceptions.GoogleAuthError as exc:
                raise GcsSigningError(f"cannot sign a GCS link: refreshing the runtime credentials failed "
                                      f"({type(exc).__name__}: {exc})") from None

    def _call(self, url: str, body: dict[str, str], email: str) -> bytes:
        self._ensure_valid()
        token = self._credentials.token
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        try:
            r = self._session.post(url, json=body, headers=headers, timeout=self.timeout_s)
        except requests.RequestException as exc:
            # requests' messages name the URL, never the headers
            log.warning("IAM signBlob at %s unreachable (%s); retrying", url, type(exc).__name__)
            raise _TransientSignBlobError(f"unreachable ({type(exc).__name__})") from None
        if r.status_code == 429 or r.status_code >= 500:
            log.warning("IAM signBlob at %s answered %s; retrying", url, r.status_code)
            raise _TransientSignBlobError(f"HTTP {r.status_code}: {_excerpt(r.text, token)}")
        if r.status_code != 200:
            hint = (f"; the runtime identity needs roles/iam.serviceAccountTokenCreator on {email}"
                    if r.status_code in (401, 403) else "")
            raise GcsSigningError(f"IAM signBlob for {email} at {url} refused with HTTP {r.status_code}: "
                                  f"{_excerpt(r.text, token)}{hint}")
        try:
            return base64.b64decode(r.json()["signedBlob"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise GcsSigningError(f"IAM signBlob at {url} answered without a valid signedBlob") from None


def _excerpt(text: str, token: str | None) -> str:
    """The start of an error body, for a message, with the token blanked should it be echoed."""
    text = " ".join((text or "").split())[:300]
    return text.replace(token, "<token>") if token else text


class GcsObjectStore(ObjectStore):
    signs_uploads = True

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, signing_key_file: str | None = None,
                 iam_endpoint: str | None = None, signer_email: str | None = None):
        self.bucket_name = bucket
        self.prefix = prefix
        self.url = f"gs://{bucket}/{prefix}".rstrip("/")
        self.emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if client is None:
            if self.emulator:
                from google.auth.credentials import AnonymousCredentials

                client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "controlplane"),
                                        credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]  # unannotated in google-auth
            else:
                client = storage.Client()
        self.client = client
        self.bucket = client.bucket(bucket)
        self.signing_key_file = signing_key_file or os.environ.get("CONTROLPLANE_GCS_SIGNING_KEY_FILE")
        universe = getattr(client, "universe_domain", None) or "googleapis.com"
        self.iam_endpoint = (iam_endpoint or os.environ.get("CONTROLPLANE_GCS_IAM_ENDPOINT")
                             or f"https://iamcredentials.{universe}").rstrip("/")
        self.signer_email = signer_email or os.environ.get("CONTROLPLANE_GCS_SIGNER_EMAIL") or None
        self._signer: Any = None
        self._iam_signer: IamSignBlobSigner | None = None

    @classmethod
    def from_url(cls, url: str) -> GcsObjectStore:
        _, bucket, prefix = split_store_url(url)
        return cls(bucket, prefix)

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(join_key(self.prefix, key))

    # ---- writes -------------------------------------------------------------------------------
    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str | None = None,
                   overwrite: bool = False) -> ObjectInfo:
        """An object smaller than one upload chunk (a task's inputs, a claim, an event) is one
        multipart request; a bigger one a resumable upload (two requests and more). Create-only
        (`overwrite` false) looks whether the key is taken first, and the write itself carries
        the precondition (`ifGenerationMatch=0`), which decides a race."""
        blob = self._blob(key)
        if not overwrite and blob.exists():
            raise ObjectExists(key)
        cond: dict[str, Any] = {} if overwrite else {"if_generation_match": 0}
        kind = content_type or "application/octet-stream"
        sha = hashlib.sha256()
        first = _read_full(stream, UPLOAD_CHUNK)
        sha.update(first)
        try:
            if len(first) < UPLOAD_CHUNK:
                blob.upload_from_string(first, content_type=kind, **cond)
                return ObjectInfo(key=key, size_bytes=len(first), sha256=sha.hexdigest(), content_type=content_type)
            size = 0
            with blob.open("wb", chunk_size=UPLOAD_CHUNK, content_type=kind, ignore_flush=True, **cond) as out:
                chunk = first
                while chunk:
                    size += len(chunk)
                    out.write(chunk)
                    chunk = stream.read(CHUNK)
                    sha.update(chunk)
        except gexc.PreconditionFailed:
            raise ObjectExists(key) from None
        return ObjectInfo(key=key, size_bytes=size, sha256=sha.hexdigest(), content_type=content_type)

    # ---- reads --------------------------------------------------------------------------------
    def open(self, key: str) -> BinaryIO:
        """One GET streamed through the client's authorized session, read as the caller reads:
        the SDK's own reader holds a whole chunk (and copies of it) per request."""
        blob = self._blob(key)
        try:
            blob.reload()
        except gexc.NotFound:
            raise FileNotFoundError(key) from None
        url = blob._get_download_url(self.client, if_generation_match=blob.generation)
        resp = self.client._http.get(url, stream=True, timeout=(60, 300))
        if resp.status_code == 404:
            resp.close()
            raise FileNotFoundError(key)
        resp.raise_for_status()
        resp.raw.decode_content = True  # as the SDK serves an object stored gzip-encoded
        stream: BinaryIO = resp.raw
        return stream

    def get_bytes(self, key: str) -> bytes:
        try:
            data: bytes = self._blob(key).download_as_bytes()
            return data
        except gexc.NotFound:
            raise FileNotFoundError(key) from None

    def stat(self, key: str) -> ObjectInfo | None:
        blob = self.bucket.get_blob(join_key(self.prefix, key))
        if blob is None:
            return None
        return ObjectInfo(key=key, size_bytes=int(blob.size or 0), content_type=blob.content_type)

    def list(self, prefix: str) -> Iterator[str]:
        full = join_key(self.prefix, prefix.rstrip("/")) + "/" if prefix.strip("/") else (
            f"{self.prefix}/" if self.prefix else "")
        cut = len(self.prefix) + 1 if self.prefix else 0
        names = sorted(b.name for b in self.client.list_blobs(self.bucket_name, prefix=full))
        return iter([n[cut:] for n in names])

    def delete_prefix(self, prefix: str) -> int:
        n = 0
        for key in list(self.list(prefix)):
            try:
                self._blob(key).delete()
                n += 1
            except gexc.NotFound:
                pass  # deleted already: deletion is idempotent
        return n

    # ---- links --------------------------------------------------------------------------------
    def signed_url(self, key: str, *, expires_in: int, filename: str) -> str:
        check_key(key)
        kwargs: dict[str, Any] = {
            "version": "v4",
            "method": "GET",
            "expiration": datetime.timedelta(seconds=min(int(expires_in), self.max_url_ttl_s)),
            "response_disposition": content_disposition(filename),
        }
        return self._sign(key, kwargs)

    def signed_put(self, key: str, *, expires_in: int, content_type: str | None = None) -> SignedRequest:
        """A V4 signed PUT (the XML API's single-request upload). The signature covers
        `x-goog-if-generation-match: 0`, so the upload must send it, and GCS refuses a second one;
        with `content_type`, it covers `Content-Type` too: the object gets that type, no other."""
        check_key(key)
        headers = {"x-goog-if-generation-match": "0"}
        kwargs: dict[str, Any] = {"version": "v4", "method": "PUT", "headers": dict(headers),  # the library adds Host
                                  "expiration": datetime.timedelta(seconds=min(int(expires_in), self.max_url_ttl_s))}
        if content_type:
            kwargs["content_type"] = content_type
            headers["Content-Type"] = content_type
        return SignedRequest("PUT", self._sign(key, kwargs), headers)

    # ---- uploads a caller sends (`controlplane.service.uploads`) ------------------------------
    def upload_plan(self, key: str, *, size_bytes: int, content_type: str, expires_in: int,
                    session: str | None, single_max: int) -> tuple[dict[str, Any], str | None]:
        """A signed PUT up to `single_max`; past it a resumable upload session the control plane
        opens (its URI is the session, and the credential: GCS keeps it a week), taking
        `Content-Range` chunks of a multiple of 256 KiB, with what GCS holds of it already."""
        if size_bytes <= single_max:
            put = self.signed_put(key, expires_in=expires_in, content_type=content_type)
            return {"form": "single", **put.as_dict()}, None
        if session is None:
            session = str(self._blob(key).create_resumable_upload_session(
                content_type=content_type, size=size_bytes, if_generation_match=0))
        step = max(RESUMABLE_UNIT, single_max // RESUMABLE_UNIT * RESUMABLE_UNIT)
        return {"form": "gcs_resumable", "method": "PUT", "url": session, "headers": {}, "chunk_bytes": step,
                "received_bytes": self._received(session, size_bytes)}, session

    @staticmethod
    def _received(session: str, size_bytes: int) -> int:
        """How many bytes a resumable session holds (asked with `Content-Range: bytes */size`)."""
        r = requests.put(session, data=b"", headers={"Content-Range": f"bytes */{size_bytes}"}, timeout=30)
        if r.status_code in (200, 201):
            return size_bytes
        if r.status_code != 308:
            raise OSError(f"GCS answered {r.status_code} for an upload session's state")
        held = r.headers.get("Range", "")
        n = int(held.rsplit("-", 1)[1]) + 1 if held.startswith("bytes=") else 0
        # Until the last chunk a session keeps whole multiples of 256 KiB; round down to one, so
        # that a reply naming a byte it does not hold (an emulator's "bytes=0-0") costs nothing.
        return n // RESUMABLE_UNIT * RESUMABLE_UNIT

    def finish_upload(self, key: str, session: str | None, size_bytes: int, content_type: str) -> None:
        if self.stat(key) is None:
            raise UploadIncomplete(key)

    def abort_upload(self, key: str, session: str | None) -> None:
        if session is not None:
            try:
                requests.delete(session, timeout=30)  # GCS answers 499: the session is gone
            except requests.RequestException as e:
                log.warning("cancelling an upload session failed (it lapses within a week): %s", type(e).__name__)

    def _sign(self, key: str, kwargs: dict[str, Any]) -> str:
        if self.emulator:
            kwargs["api_access_endpoint"] = self.emulator.rstrip("/")
        kwargs.update(self._signing_kwargs())
        url: str = self._blob(key).generate_signed_url(**kwargs)
        return url

    def _signing_kwargs(self) -> dict[str, Any]:
        if self.signing_key_file:
            if self._signer is None:
                from google.oauth2 import service_account

                self._signer = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]  # unannotated in google-auth
                    self.signing_key_file)
            return {"credentials": self._signer}
        creds = self.client._credentials
        if hasattr(creds, "sign_bytes") and getattr(creds, "signer", None) is not None:
            return {"credentials": creds}  # a service-account key (or a signer of its own)
        # Runtime identity without a key (Cloud Run): sign through IAM signBlob at our endpoint.
        if self._iam_signer is None:
            self._iam_signer = IamSignBlobSigner(creds, self.iam_endpoint, self.signer_email)
        return {"credentials": self._iam_signer}


def _read_full(stream: BinaryIO, n: int) -> bytes:
    """Up to `n` bytes of `stream`: fewer only at its end (a read may return less than asked)."""
    parts: list[bytes] = []
    got = 0
    while got < n and (chunk := stream.read(n - got)):
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
