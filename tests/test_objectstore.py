"""The local object store and its signed download links.

The store keeps objects immutable, hashes what it streams, and refuses keys that could escape its
root. Its links are HMAC-signed over key, expiry and filename: the control plane's HTTP routes
serve an untouched link, and answer 403 to any change of it, and never serve a file outside the
store even for a correctly signed key that points there."""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit, urlunsplit

import httpx
import pytest

from controlplane.app import ControlPlane
from controlplane.objectstore import ObjectExists, UnsafeKey, open_store
from controlplane.objectstore.base import CHUNK
from controlplane.objectstore.local import LinkSigner, LocalObjectStore
from tests.conftest import Agent

UNSAFE_KEYS = [
    "../escape",
    "a/../../escape",
    "a/..",
    "/etc/passwd",
    "a\\..\\b",
    "a/\x00b",
    "a/b\nc",
    "a\x7fb",
    "",
    "a//b",
    "./a",
    "a/./b",
    "a/",
    "x" * 1025,
]


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


class Trickle:
    """A non-seekable stream that hands out its bytes a few at a time."""

    def __init__(self, data: bytes, piece: int = 7777):
        self._data = data
        self._pos = 0
        self._piece = piece

    def read(self, n: int = -1) -> bytes:
        n = self._piece if n < 0 else min(n, self._piece)
        out = self._data[self._pos:self._pos + n]
        self._pos += len(out)
        return out


# ---- the store ----------------------------------------------------------------------------------
def test_objects_are_immutable(store: LocalObjectStore) -> None:
    store.put_bytes("tasks/t1/result.json", b'{"v": 1}')
    with pytest.raises(ObjectExists):
        store.put_bytes("tasks/t1/result.json", b'{"v": 2}')
    assert store.get_bytes("tasks/t1/result.json") == b'{"v": 1}'
    # The refused write left nothing behind (no temporary upload files either).
    assert list(store.list("tasks/")) == ["tasks/t1/result.json"]
    assert [p.name for p in (store.root / "tasks/t1").iterdir()] == ["result.json"]
    # Overwriting is possible only when asked for explicitly.
    store.put_bytes("tasks/t1/result.json", b'{"v": 3}', overwrite=True)
    assert store.get_bytes("tasks/t1/result.json") == b'{"v": 3}'


def test_streaming_put_computes_sha256_and_size(store: LocalObjectStore) -> None:
    data = hashlib.sha256(b"seed").digest() * (CHUNK // 32 * 2 + 1234)  # a bit over two chunks
    info = store.put_stream("big/blob.bin", Trickle(data), content_type="application/octet-stream")
    assert info.size_bytes == len(data) > 2 * CHUNK
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.content_type == "application/octet-stream"
    assert store.stat("big/blob.bin").size_bytes == len(data)
    assert store.get_bytes("big/blob.bin") == data

    empty = store.put_stream("big/empty", io.BytesIO(b""))
    assert (empty.size_bytes, empty.sha256) == (0, hashlib.sha256(b"").hexdigest())


def test_signed_links_are_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A download and an upload link, byte for byte as released, and each checked by its verify:
    links already handed out must keep working across a change of how they are made."""
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.5)
    signer = LinkSigner(b"pinned-key", "0123456789abcdef", "http://127.0.0.1:8000/")
    get = signer.url("tasks/tsk_1/a b+c.bin", expires_in=600, filename="a b.bin")
    assert get == ("http://127.0.0.1:8000/objects/0123456789abcdef/tasks/tsk_1/a%20b%2Bc.bin?expires=1800000600"
                   "&filename=a+b.bin&signature=9b0045273eb8543136e3a0d968f86c1fe9c09a5c6d5c336e466b19496e5bec5f")
    put = signer.put_url("uploads/upl_1/x y.csv", expires_in=900, size=12345)
    assert put == ("http://127.0.0.1:8000/uploads/0123456789abcdef/uploads/upl_1/x%20y.csv?expires=1800000900"
                   "&size=12345&signature=75b24f32506ce27291f404845138a68f8da40a570f01ded7b914ac67743eeb64")
    get_sig, put_sig = (parse_qs(urlsplit(u).query)["signature"][0] for u in (get, put))
    assert signer.verify("tasks/tsk_1/a b+c.bin", "1800000600", "a b.bin", get_sig)
    assert not signer.verify("tasks/tsk_1/a b+c.bin", "1800000600", "a.bin", get_sig)
    assert not signer.verify("tasks/tsk_1/a b+c.bin", "1800000600", "a b.bin", put_sig)
    assert signer.verify_put("uploads/upl_1/x y.csv", "1800000900", "12345", put_sig) == 12345
    assert signer.verify_put("uploads/upl_1/x y.csv", "1800000900", "12346", put_sig) is None
    assert signer.verify_put("uploads/upl_1/x y.csv", "1800000900", "12345", get_sig) is None
    monkeypatch.setattr(time, "time", lambda: 1_800_000_901.0)
    assert signer.verify_put("uploads/upl_1/x y.csv", "1800000900", "12345", put_sig) is None
    assert not signer.verify("tasks/tsk_1/a b+c.bin", "1800000600", "a b.bin", get_sig)


@pytest.mark.parametrize("key", UNSAFE_KEYS, ids=repr)
def test_unsafe_keys_are_refused_everywhere(store: LocalObjectStore, key: str, tmp_path: Path) -> None:
    store.signer = LinkSigner(b"k", "sid", "http://127.0.0.1:1")
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(UnsafeKey):
        store.put_bytes(key, b"data")
    with pytest.raises(UnsafeKey):
        store.open(key)
    with pytest.raises(UnsafeKey):
        store.stat(key)
    with pytest.raises(UnsafeKey):
        store.signed_url(key, expires_in=60, filename="f")
    if not key.endswith("/"):  # "a/" is a fine prefix, just not an object key
        with pytest.raises(UnsafeKey):
            store.delete_prefix(key)
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_a_symlink_cannot_lead_out_of_the_store(store: LocalObjectStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("do not read")
    (store.root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeKey):
        store.open("link/secret")
    with pytest.raises(UnsafeKey):
        store.put_bytes("link/new", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_delete_prefix_is_idempotent(store: LocalObjectStore) -> None:
    for key in ("tasks/a/1", "tasks/a/sub/2", "tasks/ab/3", "tasks/b/4"):
        store.put_bytes(key, b"x")
    assert store.delete_prefix("tasks/a/") == 2
    assert store.delete_prefix("tasks/a/") == 0
    assert store.delete_prefix("tasks/never/") == 0
    assert list(store.list("tasks/")) == ["tasks/ab/3", "tasks/b/4"]


def test_open_store_picks_the_local_backend(tmp_path: Path) -> None:
    s = open_store((tmp_path / "o").as_uri())
    assert isinstance(s, LocalObjectStore) and s.root == (tmp_path / "o").resolve()
    with pytest.raises(ValueError, match="unsupported object store URL scheme"):
        open_store("ftp://example.com/bucket")


# ---- signed links, served by the control plane --------------------------------------------------
def exercise_bytes(n: int) -> bytes:
    """What the exercise tool writes as data.bin (a deterministic pattern)."""
    block = hashlib.sha256(b"exercise").digest() * (65536 // 32)
    return (block * (n // len(block) + 1))[:n]


def with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    q.update(changes)
    return urlunsplit(parts._replace(query=urlencode(q)))


def with_key(url: str, key: str) -> str:
    parts = urlsplit(url)
    sid = parts.path.split("/")[2]
    return urlunsplit(parts._replace(path=f"/objects/{sid}/{quote(key)}"))


def link(base: str, sid: str, key: str, expires: int, filename: str, signature: str,
         raw_key: str | None = None) -> str:
    query = urlencode({"expires": expires, "filename": filename, "signature": signature})
    return f"{base}/objects/{sid}/{raw_key if raw_key is not None else quote(key)}?{query}"


@pytest.fixture
async def artifact(agent: Agent, cp: ControlPlane) -> dict:
    """A real artifact of a finished exercise task, with its download link."""
    tid = await agent.submit(inputs={"artifact_bytes": 150_000})
    assert (await agent.wait(tid))["state"] == "succeeded"
    [art] = (await agent.call("get_task_result", task_id=tid))["artifacts"]
    art["task_id"] = tid
    _, _, art["sid"], key = urlsplit(art["download_url"]).path.split("/", 3)
    art["key"] = unquote(key)
    return art


@pytest.mark.anyio
async def test_untouched_link_downloads_the_exact_bytes(artifact: dict) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.get(artifact["download_url"])
    assert r.status_code == 200
    assert r.content == exercise_bytes(150_000)
    assert hashlib.sha256(r.content).hexdigest() == artifact["sha256"]
    assert 'filename="data.bin"' in r.headers["content-disposition"]
    assert int(r.headers["content-length"]) == artifact["size_bytes"] == 150_000


@pytest.mark.anyio
async def test_tampered_links_are_forbidden(artifact: dict, cp: ControlPlane) -> None:
    url = artifact["download_url"]
    sig = parse_qs(urlsplit(url).query)["signature"][0]
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    other_key = f"tasks/{artifact['task_id']}/attempts/1/inputs.json"
    assert cp.object_stores.default.stat(other_key) is not None  # a real object: only the signature stops it
    tampered = {
        "signature": with_query(url, signature=flipped),
        "no signature": with_query(url, signature=""),
        "key": with_key(url, other_key),
        "filename": with_query(url, filename="data.exe"),
        "expiry extended": with_query(url, expires=str(int(parse_qs(urlsplit(url).query)["expires"][0]) + 3600)),
        "expiry not a number": with_query(url, expires="never"),
    }
    async with httpx.AsyncClient() as http:
        assert (await http.get(url)).status_code == 200
        for what, bad in tampered.items():
            r = await http.get(bad)
            assert r.status_code == 403, (what, r.status_code)
            assert r.content == b'{"error":"invalid or expired link"}', what


@pytest.mark.anyio
async def test_expired_link_is_forbidden(artifact: dict, cp: ControlPlane) -> None:
    # A link forged with the server's own key (as the server would sign it) but expired a minute ago.
    sid = artifact["sid"]
    signer = LinkSigner(cp.settings.secret_key(), sid)
    base = cp.public_url
    past = int(time.time()) - 60
    future = int(time.time()) + 600
    expired = link(base, sid, artifact["key"], past, "data.bin", signer.signature(artifact["key"], past, "data.bin"))
    fresh = link(base, sid, artifact["key"], future, "data.bin", signer.signature(artifact["key"], future, "data.bin"))
    async with httpx.AsyncClient() as http:
        assert (await http.get(fresh)).status_code == 200  # the forger is right about the key...
        r = await http.get(expired)
    assert r.status_code == 403  # ...so only the expiry refuses this one
    assert r.content == b'{"error":"invalid or expired link"}'


@pytest.mark.anyio
async def test_signed_link_cannot_reach_outside_the_store(artifact: dict, cp: ControlPlane) -> None:
    secret = cp.settings.secret_key()
    assert (cp.settings.home / "secret.key").read_bytes().strip() == secret
    assert (cp.object_stores.default.root / ".." / "secret.key").resolve() == (cp.settings.home / "secret.key").resolve()
    future = int(time.time()) + 600
    signer = cp.object_stores.default.signer
    attempts = [
        # key the signature covers, how it is written in the URL path
        ("../secret.key", "%2E%2E/secret.key"),
        ("../secret.key", "%2e%2e%2fsecret.key"),
        ("../secret.key", "..%2Fsecret.key"),
        (str(cp.settings.home / "secret.key"), quote(str(cp.settings.home / "secret.key"))),
        (str(cp.settings.home / "secret.key"), quote(str(cp.settings.home / "secret.key"), safe="")),
        ("tasks/../../secret.key", "tasks/%2E%2E/%2E%2E/secret.key"),
    ]
    async with httpx.AsyncClient() as http:
        for key, raw in attempts:
            url = link(cp.public_url, artifact["sid"], key, future, "secret.key",
                       signer.signature(key, future, "secret.key"), raw_key=raw)
            for method in ("GET", "HEAD"):
                r = await http.request(method, url)
                assert r.status_code in (403, 404), (raw, method, r.status_code)
                assert secret not in r.content, raw
