"""The cloud object stores against their emulators: the store contract (streaming, immutable,
idempotent deletes, safe keys), signed links that download exactly one object under its
filename and expire when they should, and whole tasks whose results and artifacts live in the
cloud store, down to their expiry.

azurite checks SAS signatures and expiry itself; moto and the GCS emulator do not, so for S3 and
GCS the tests rebuild each link's canonical request and check its signature and lifetime.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, quote, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.objectstore import ObjectExists, UnsafeKey, open_store
from controlplane.objectstore.base import task_prefix
from controlplane.settings import Settings
from tests.cloud import AWS_ENV, CloudTarget, azure, azurite_server, cloud, gcs_server, moto_server  # noqa: F401
from tests.conftest import FAST, Agent, expire_soon
from tests.proxy import Proxy

SEVEN_DAYS = 7 * 24 * 3600


class Chunks(io.RawIOBase):
    """A non-seekable stream of `size` deterministic bytes, produced as it is read."""

    def __init__(self, size: int):
        self.left = size
        self.block = hashlib.sha256(b"cloud").digest() * 2048  # 64 KiB

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        out = (self.block * (n // len(self.block) + 1))[:n]
        self.left -= n
        return out


def expected_sha(size: int) -> str:
    sha = hashlib.sha256()
    stream = Chunks(size)
    while b := stream.read(1 << 20):
        sha.update(b)
    return sha.hexdigest()


# ---- the store contract -----------------------------------------------------------------------
def test_store_contract(cloud: CloudTarget) -> None:
    store = open_store(cloud.url)
    info = store.put_bytes("a/b.txt", b"hello", content_type="text/plain")
    assert (info.size_bytes, info.sha256) == (5, hashlib.sha256(b"hello").hexdigest())
    with pytest.raises(ObjectExists):
        store.put_bytes("a/b.txt", b"another")  # objects are immutable
    assert store.get_bytes("a/b.txt") == b"hello"
    assert store.stat("a/b.txt").size_bytes == 5
    assert store.stat("a/missing") is None
    with pytest.raises(FileNotFoundError):
        store.get_bytes("a/missing")
    with pytest.raises(FileNotFoundError):
        store.open("a/missing")

    size = 20 * 1024 * 1024 + 12345  # several parts / blocks / chunks, the last one short
    big = store.put_stream("a/big.bin", Chunks(size))
    assert (big.size_bytes, big.sha256) == (size, expected_sha(size))
    with pytest.raises(ObjectExists):
        store.put_stream("a/big.bin", Chunks(size))
    read = hashlib.sha256()
    with store.open("a/big.bin") as f:
        while chunk := f.read(1 << 20):
            read.update(chunk)
    assert read.hexdigest() == big.sha256

    for edge in (8 << 20) - 1, 8 << 20:  # either side of GCS's one-request limit (one upload chunk)
        info = store.put_stream(f"e/{edge}", Chunks(edge))
        assert (info.size_bytes, info.sha256) == (edge, expected_sha(edge))
        assert store.stat(f"e/{edge}").size_bytes == edge
    assert store.delete_prefix("e") == 2

    assert list(store.list("a")) == ["a/b.txt", "a/big.bin"]
    assert store.delete_prefix("a") == 2
    assert store.delete_prefix("a") == 0  # deleting again is fine
    assert list(store.list("a")) == []
    for bad in ("../x", "/abs", "a/../b", "a\\b", "a\x00b", ""):
        with pytest.raises(UnsafeKey):
            store.put_bytes(bad, b"x")


def test_a_small_gcs_object_is_one_upload_request(gcs_server: str, tmp_path: Path,  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's inputs, a claim, an event: a small create-only write is a look whether the key is
    taken and one multipart upload (it was a resumable upload's two requests after the look); a
    big one is still resumable, and both read back whole."""
    from tests.cloud import gcs_target

    target = gcs_target(gcs_server, tmp_path)
    proxy = Proxy(gcs_server)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        store = open_store(target.url)
        store.put_bytes("t/first", b"x")  # (the store looks its bucket up once, at its first call)
        proxy.requests.clear()
        store.put_bytes("t/inputs.json", b'{"n": 1}', content_type="application/json")
        uploads = [(m, p) for _t, m, p in proxy.requests if p.startswith("/upload/")]
        assert len(uploads) == 1 and uploads[0][0] == "POST" and "uploadType=multipart" in uploads[0][1], proxy.requests
        assert len(proxy.requests) == 2, proxy.requests  # the look, the upload
        proxy.requests.clear()
        store.put_bytes("t/inputs.json", b'{"n": 1}', overwrite=True)
        assert len(proxy.requests) == 1, proxy.requests
        proxy.requests.clear()
        size = 9 << 20
        store.put_stream("t/big.bin", Chunks(size))
        # resumable (its chunks go to the session's URL, which the emulator names without the proxy)
        assert any("uploadType=resumable" in p for _t, _m, p in proxy.requests), proxy.requests
        assert store.get_bytes("t/inputs.json") == b'{"n": 1}'
        assert store.stat("t/big.bin").size_bytes == size
    finally:
        proxy.close()


# ---- signed links -----------------------------------------------------------------------------
def verify_sigv4(url: str, secret: str, method: str = "GET") -> dict[str, str]:
    """Rebuild a SigV4 presigned request's canonical request and check its signature."""
    parts = urlsplit(url)
    pairs = [p for p in parts.query.split("&") if not p.startswith("X-Amz-Signature=")]
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    canonical = "\n".join([method, parts.path, "&".join(sorted(pairs)), f"host:{parts.netloc}", "", "host",
                           "UNSIGNED-PAYLOAD"])
    date, region, service, _ = q["X-Amz-Credential"].split("/")[1:]
    to_sign = "\n".join(["AWS4-HMAC-SHA256", q["X-Amz-Date"], f"{date}/{region}/{service}/aws4_request",
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    assert hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest() == q["X-Amz-Signature"]
    return q


def verify_gcs_v4(url: str, service_account: dict, method: str = "GET",
                  headers: dict[str, str] | None = None) -> dict[str, str]:
    """Rebuild a GCS V4 signed URL's canonical request (with the `headers` it must be sent with)
    and check its RSA signature."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding

    parts = urlsplit(url)
    pairs = [p for p in parts.query.split("&") if not p.startswith("X-Goog-Signature=")]
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    signed = sorted({"host": parts.netloc, **{k.lower(): v for k, v in (headers or {}).items()}}.items())
    assert q["X-Goog-SignedHeaders"] == ";".join(k for k, _ in signed)
    canonical = "\n".join([method, parts.path, "&".join(sorted(pairs)), *(f"{k}:{v}" for k, v in signed), "",
                           q["X-Goog-SignedHeaders"], "UNSIGNED-PAYLOAD"])
    scope = q["X-Goog-Credential"].split("/", 1)[1]
    to_sign = "\n".join(["GOOG4-RSA-SHA256", q["X-Goog-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = serialization.load_pem_private_key(service_account["private_key"].encode(), password=None)
    key.public_key().verify(bytes.fromhex(q["X-Goog-Signature"]), to_sign.encode(), padding.PKCS1v15(),
                            hashes.SHA256())  # raises InvalidSignature on a forgery
    assert q["X-Goog-Credential"].startswith(service_account["client_email"] + "/")
    return q


def lifetime(cloud: CloudTarget, url: str) -> int:
    """Check a link's signature; return the seconds it was signed to live for."""
    if cloud.name == "s3":
        q = verify_sigv4(url, AWS_ENV["AWS_SECRET_ACCESS_KEY"])
        signed_at = datetime.strptime(q["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        assert abs(signed_at - time.time()) < 60
        return int(q["X-Amz-Expires"])
    if cloud.name == "gcs":
        assert cloud.signing_key is not None
        q = verify_gcs_v4(url, cloud.signing_key)
        signed_at = datetime.strptime(q["X-Goog-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        assert abs(signed_at - time.time()) < 60
        return int(q["X-Goog-Expires"])
    q = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    expiry = datetime.strptime(q["se"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    return round(expiry - time.time())


def test_signed_link_downloads_one_object_under_its_filename(cloud: CloudTarget) -> None:
    store = open_store(cloud.url)
    payload = b"\x00\x01artifact bytes\xff" * 1000
    store.put_bytes("t/attempts/1/artifacts/out/result.bin", payload)
    store.put_bytes("t/attempts/1/artifacts/other.bin", b"someone else")
    url = store.signed_url("t/attempts/1/artifacts/out/result.bin", expires_in=300, filename="result.bin")
    r = httpx.get(url)
    assert r.status_code == 200 and r.content == payload
    assert 'filename="result.bin"' in r.headers["content-disposition"]
    assert abs(lifetime(cloud, url) - 300) <= 2
    # a month asked for, the cloud's maximum given
    assert lifetime(cloud, store.signed_url("t/attempts/1/artifacts/other.bin", expires_in=30 * 86400,
                                            filename="x")) <= SEVEN_DAYS


def test_signed_put_uploads_one_object_once(cloud: CloudTarget) -> None:
    """What a job without credentials uploads with: one key, once, for as long as it was signed.
    The GCS emulator's XML upload takes a body it cannot parse as JSON (it reads JSON bodies as
    objects and fails) and does not enforce `x-goog-if-generation-match`, so for GCS the body is
    sent as octet-stream and the refusal of a second upload is checked through the signature,
    which makes the header part of the request."""
    store = open_store(cloud.url)
    put = store.signed_put("t/attempts/1/result.json", expires_in=300)
    assert put.method == "PUT"
    body = b'{"status": "succeeded"}'
    ctype = "application/octet-stream" if cloud.name == "gcs" else "application/json"
    r = httpx.put(put.url, content=body, headers={**put.headers, "Content-Type": ctype})
    assert r.status_code in (200, 201), r.text
    assert store.get_bytes("t/attempts/1/result.json") == body
    assert list(store.list("t")) == ["t/attempts/1/result.json"]  # exactly the key it names
    if cloud.name == "gcs":
        assert put.headers == {"x-goog-if-generation-match": "0"}
        q = verify_gcs_v4(put.url, cloud.signing_key or {}, "PUT", put.headers)
        assert int(q["X-Goog-Expires"]) == 300
    else:
        again = httpx.put(put.url, content=b"overwritten", headers={**put.headers, "Content-Type": ctype})
        assert again.status_code in (409, 412)  # S3 412 (If-None-Match), Azure 409 (BlobAlreadyExists)
        assert store.get_bytes("t/attempts/1/result.json") == body
    if cloud.name == "s3":
        assert int(verify_sigv4(put.url, AWS_ENV["AWS_SECRET_ACCESS_KEY"], "PUT")["X-Amz-Expires"]) == 300
    if cloud.name == "azure":  # azurite checks SAS signatures: a grant for one blob writes no other
        other = put.url.replace("/t/attempts/1/result.json?", "/t/attempts/2/result.json?")
        assert httpx.put(other, content=b"x", headers=put.headers).status_code == 403
        expired = store.signed_put("t/attempts/1/late.json", expires_in=-60)
        assert httpx.put(expired.url, content=b"x", headers=expired.headers).status_code == 403
        assert store.stat("t/attempts/2/result.json") is None and store.stat("t/attempts/1/late.json") is None
    month = {k: v[0] for k, v in parse_qs(urlsplit(store.signed_put("t/x", expires_in=30 * 86400).url).query).items()}
    if "se" in month:  # Azure: an expiry time
        until = datetime.strptime(month["se"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        assert until - time.time() <= SEVEN_DAYS
    else:
        assert int(month.get("X-Amz-Expires") or month["X-Goog-Expires"]) <= SEVEN_DAYS


def test_the_local_store_signs_no_uploads(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="cannot sign uploads"):
        open_store(tmp_path.as_uri()).signed_put("t/attempts/1/result.json", expires_in=60)


def with_param(url: str, name: str, value: str) -> str:
    parts = urlsplit(url)
    pairs = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    pairs = [(k, value if k == name else v) for k, v in pairs]
    return urlunsplit(parts._replace(query=urlencode(pairs, quote_via=quote)))


def test_tampered_or_expired_azure_links_are_refused(azure: CloudTarget) -> None:
    """azurite checks SAS signatures and expiry like Azure does."""
    store = open_store(azure.url)
    store.put_bytes("k/a.bin", b"secret bytes")
    store.put_bytes("k/b.bin", b"other secret")
    good = store.signed_url("k/a.bin", expires_in=300, filename="a.bin")
    assert httpx.get(good).status_code == 200
    sig = dict(parse_qsl(urlsplit(good).query))["sig"]
    forged = with_param(good, "sig", sig[:10] + ("A" if sig[10] != "A" else "B") + sig[11:])
    assert httpx.get(forged).status_code == 403
    renamed = with_param(good, "rscd", 'attachment; filename="a.exe"')  # the filename is signed too
    assert httpx.get(renamed).status_code == 403
    other_blob = good.replace("/k/a.bin?", "/k/b.bin?")  # the signature names exactly one blob
    assert httpx.get(other_blob).status_code == 403
    expired = store.signed_url("k/a.bin", expires_in=-60, filename="a.bin")
    assert httpx.get(expired).status_code == 403


# ---- a whole task in the cloud store ----------------------------------------------------------
@pytest.mark.anyio
async def test_task_results_and_artifacts_live_in_the_cloud_store(cloud: CloudTarget, home: Path) -> None:
    cp = ControlPlane(Settings(home=home, object_store_url=cloud.url, **FAST))
    store = open_store(cloud.url)
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"artifact_bytes": 3 * 1024 * 1024 + 7, "log_lines": 20,
                                         "result": {"cloud": cloud.name}})
        st = await agent.wait(tid, timeout=120)
        assert st["state"] == "succeeded", st
        res = await agent.call("get_task_result", task_id=tid)
        assert res["result"]["cloud"] == cloud.name
        [art] = res["artifacts"]
        body = httpx.get(art["download_url"]).content
        assert len(body) == art["size_bytes"] == 3 * 1024 * 1024 + 7
        assert hashlib.sha256(body).hexdigest() == art["sha256"] == res["result"]["artifact_sha256"]
        keys = set(store.list(task_prefix(tid)))
        assert {f"{task_prefix(tid)}attempts/1/{name}" for name in
                ("inputs.json", "result.json", "artifacts/data.bin")} <= keys

        with cp.db.write() as c:  # its ttl has passed
            c.execute(text("update tasks set expires_at = 0 where task_id = :t"), {"t": tid})
        await expire_soon(cp, tid)
        assert (await agent.call("get_task_status", task_id=tid))["state"] == "expired"
        assert list(store.list(task_prefix(tid))) == []
        assert httpx.get(art["download_url"]).status_code in (403, 404)


def test_a_jobs_granted_store_reads_and_writes_only_through_grants(azure: CloudTarget) -> None:
    """The runner's GrantedStore against azurite, which checks every SAS: grants signed by the
    control plane's own code (`sign_grants`), handed over as the grants route would. A grant
    that died early (a 403) is asked for again once; with no answer, a spill takes a key granted
    ahead; a name outside the attempt is refused before any request."""
    from controlplane.objectstore.base import attempt_prefix, inputs_key, result_key
    from controlplane.objectstore.grants import sign_grants
    from controlplane_runner.granted import GrantedStore, NoGrant

    store = open_store(azure.url)
    store.put_bytes(inputs_key(AttemptRef("tsk_1", 1)), b'{"n": 1}')
    asked: list[tuple[list[str], bool]] = []
    state = {"up": True, "ttl": -60}  # the first grants are already dead

    def ask(names: list[str], *, ahead: bool = False) -> dict[str, dict[str, object]] | None:
        asked.append((names, ahead))
        if not state["up"]:
            return None
        ttl, state["ttl"] = state["ttl"], 300
        grants = sign_grants(store, AttemptRef("tsk_1", 1), names, expires_in=ttl)
        # dead already, but said to live (as an S3 URL whose signing session ended early)
        return {n: {**g, "expires_in": 300} for n, g in grants.items()}

    job = GrantedStore(azure.url, AttemptRef("tsk_1", 1), ask, pool=2)
    assert job.prefetch()  # result.json and two spill keys, ahead (dead ones, here)
    assert asked[-1] == (["result.json", "events/spill-0000.jsonl", "events/spill-0001.jsonl"], True)
    job.put_bytes(result_key(AttemptRef("tsk_1", 1)), b'{"status": "succeeded"}')  # 403, asked again, written
    assert asked[-1] == (["result.json"], False)
    assert store.get_bytes(result_key(AttemptRef("tsk_1", 1))) == b'{"status": "succeeded"}'
    with pytest.raises(ObjectExists):
        job.put_bytes(result_key(AttemptRef("tsk_1", 1)), b"again")
    assert job.get_bytes(inputs_key(AttemptRef("tsk_1", 1))) == b'{"n": 1}'

    state["up"] = False  # the control plane is unreachable: spills go to the pool
    with pytest.raises(OSError):  # the pool's grants died as well (signed with ttl -60)
        job.put_bytes(attempt_prefix(AttemptRef("tsk_1", 1)) + "events/000000000001.jsonl", b"{}\n")
    state["up"] = True
    fresh = GrantedStore(azure.url, AttemptRef("tsk_1", 1), ask, pool=2)
    assert fresh.prefetch()
    state["up"] = False
    fresh.put_bytes(attempt_prefix(AttemptRef("tsk_1", 1)) + "events/000000000001.jsonl", b'{"seq": 1}\n')
    assert list(store.list(attempt_prefix(AttemptRef("tsk_1", 1)) + "events")) == [
        attempt_prefix(AttemptRef("tsk_1", 1)) + "events/spill-0000.jsonl"]
    with pytest.raises(NoGrant):
        fresh.put_bytes(attempt_prefix(AttemptRef("tsk_1", 1)) + "artifacts/a.bin", b"x")  # no pool for artifacts
    with pytest.raises(UnsafeKey):
        fresh.put_bytes(result_key(AttemptRef("tsk_2", 1)), b"{}")  # another task's key: no request at all
