"""Uploads as a user makes them: `controlplane put` against a real HTTP server (its MCP tools and
the local store's signed PUT route, or S3 on moto's server), resumed after an interruption, and
what the server refuses: bytes that are not those promised (UPLOAD_MISMATCH, the object gone), a
tampered or expired link (403), another caller's upload (NOT_FOUND, as a missing one), and
expired uploads swept away with their objects."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.callers import ALICE, BOB, TOKENS, caller
from tests.cloud import CloudTarget, azurite_server, cloud, gcs_server, moto_server, s3_target  # noqa: F401
from tests.conftest import FAST, ROOT, Agent, serving

MIB = 1024 * 1024
pytestmark = pytest.mark.anyio
REF = re.compile(r"^upload://(upl_[0-9a-z]+)$", re.M)


def make_file(path: Path, size: int, seed: bytes = b"upload") -> str:
    """A file of `size` deterministic bytes; its sha256."""
    block = hashlib.sha256(seed).digest() * 32768  # 1 MiB
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            b = block[: min(left, len(block))]
            f.write(b)
            sha.update(b)
            left -= len(b)
    return sha.hexdigest()


def sha_of(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(MIB):
            sha.update(b)
    return sha.hexdigest()


def user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}


async def put(server_url: str, path: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """`controlplane put` in a subprocess (off the loop: the server runs on it)."""
    cmd = [sys.executable, "-m", "controlplane.cli", "put", str(path), "--url", server_url, *args]
    if token:
        cmd += ["--token", token]
    return await anyio.to_thread.run_sync(lambda: subprocess.run(
        cmd, env={**user_env(), "COLUMNS": "200"}, cwd=ROOT, capture_output=True, text=True, timeout=300))


def reference(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    m = REF.search(done.stdout)
    assert m, done.stdout
    return m.group(1)


async def aput(url: str, **kw: Any) -> httpx.Response:
    """A PUT from the test, on the loop the in-process server runs on."""
    async with httpx.AsyncClient(timeout=60) as h:
        return await h.put(url, **kw)


@asynccontextmanager
async def running(settings: Settings, token: str = ALICE) -> AsyncIterator[tuple[ControlPlane, Any, Agent]]:
    cp = ControlPlane(settings)
    async with serving(cp) as server, caller(server.url, token) as agent:
        yield cp, server, agent


async def created(agent: Agent, name: str, body: bytes, sha256: str | None = None) -> dict[str, Any]:
    """create_upload's answer for `body` as `name` (or for bytes whose sha256 is `sha256`)."""
    return await agent.call("create_upload", name=name, size_bytes=len(body),
                            sha256=sha256 or hashlib.sha256(body).hexdigest())


async def uploaded(agent: Agent, name: str, body: bytes, sha256: str | None = None) -> dict[str, Any]:
    """`created`, and `body` sent through its one signed PUT (201)."""
    up = await created(agent, name, body, sha256)
    assert (await aput(up["plan"]["url"], content=body)).status_code == 201
    return up


@pytest.fixture
def local(home: Path) -> Settings:
    return Settings(home=home, **FAST, auth_tokens=TOKENS, upload_single_max_bytes=5 * MIB)


def object_path(cp: ControlPlane, upload_id: str, name: str) -> Path:
    return cp.object_stores.default.path_of(f"uploads/{upload_id}/{name}")  # type: ignore[attr-defined, no-any-return]


async def test_put_sends_a_small_and_a_chunked_file_through_the_local_route(local: Settings, tmp_path: Path) -> None:
    small, big = tmp_path / "small.csv", tmp_path / "big.bin"
    small_sha, big_sha = make_file(small, 1000), make_file(big, 12 * MIB + 3)
    async with running(local) as (cp, server, agent):
        for path, sha, form in ((small, small_sha, "single"), (big, big_sha, "content_range")):
            upload_id = reference(await put(server.url, path, token=ALICE))
            stored = object_path(cp, upload_id, path.name)
            assert stored.is_file() and sha_of(stored) == sha
            done = await agent.call("complete_upload", upload_id=upload_id)  # again: the same answer
            assert done["state"] == "complete" and done["sha256"] == sha and done["reference"] == f"upload://{upload_id}"
            again = await agent.call("create_upload", name=path.name, size_bytes=path.stat().st_size, sha256=sha)
            assert again["upload_id"] != upload_id, "a completed upload is not handed out again"
            assert again["plan"]["form"] == form
        assert done["content_type"] == "application/octet-stream"


async def test_an_interrupted_upload_resumes_where_it_stopped(local: Settings, tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    sha = make_file(path, 13 * MIB)
    async with running(local) as (cp, server, agent):
        first = await agent.call("create_upload", name="data.bin", size_bytes=13 * MIB, sha256=sha)
        plan = first["plan"]
        assert plan["form"] == "content_range" and plan["received_bytes"] == 0 and plan["chunk_bytes"] == 5 * MIB
        data = path.read_bytes()

        async def cut_off() -> AsyncIterator[bytes]:  # the second chunk: part of it, then the connection drops
            yield data[5 * MIB : 7 * MIB + 17]
            raise ConnectionResetError("cable pulled")

        async with httpx.AsyncClient() as h:
            r = await h.put(plan["url"], content=data[: 5 * MIB], headers={"Content-Range": f"bytes 0-{5 * MIB - 1}/{13 * MIB}"})
            assert r.status_code == 200 and r.json() == {"received_bytes": 5 * MIB}
        with pytest.raises(Exception):  # noqa: B017 - whatever the client makes of a dying body
            await aput(plan["url"], content=cut_off(), headers={"Content-Range": f"bytes {5 * MIB}-{10 * MIB - 1}/{13 * MIB}",
                                                              "Content-Length": str(5 * MIB)})
        early = await agent.error("complete_upload", upload_id=first["upload_id"])
        assert early["code"] == "UPLOAD_INCOMPLETE"
        done = await put(server.url, path, token=ALICE)
        assert reference(done) == first["upload_id"]
        m = re.search(r"resuming upl_\w+: (\d+) bytes already there", done.stderr)
        assert m and int(m.group(1)) >= 5 * MIB, done.stderr
        assert sha_of(object_path(cp, first["upload_id"], "data.bin")) == sha


async def test_bytes_other_than_promised_are_refused_and_deleted(local: Settings, tmp_path: Path) -> None:
    async with running(local) as (cp, _server, agent):
        promised = hashlib.sha256(b"a" * 100).hexdigest()
        up = await uploaded(agent, "x.txt", b"b" * 100, sha256=promised)
        assert object_path(cp, up["upload_id"], "x.txt").is_file()
        err = await agent.error("complete_upload", upload_id=up["upload_id"])
        assert err["code"] == "UPLOAD_MISMATCH" and err["expected"] == promised, err
        assert not object_path(cp, up["upload_id"], "x.txt").parent.exists()
        assert (await agent.error("complete_upload", upload_id=up["upload_id"]))["code"] == "NOT_FOUND"
        longer = await aput(up["plan"]["url"], content=b"a" * 101)  # the link takes its size, no more
        assert longer.status_code in (400, 409), longer.text


async def test_a_tampered_or_expired_link_is_refused(local: Settings) -> None:
    async with running(local) as (cp, _server, agent):
        body = b"hello"
        up = await created(agent, "h.txt", body)
        url = up["plan"]["url"]
        other = await created(agent, "o.txt", b"other")
        tampered = [url.replace("size=5", "size=6"), re.sub(r"signature=(\w)", lambda m: "signature=" + ("1" if m.group(1) == "0" else "0"), url),
                    url.replace(up["upload_id"], other["upload_id"]), re.sub(r"expires=(\d+)", lambda m: f"expires={int(m.group(1)) + 60}", url)]
        signer = cp.object_stores.default.signer  # type: ignore[attr-defined]
        expired = signer.put_url(f"uploads/{up['upload_id']}/h.txt", expires_in=-1, size=5)
        for bad in [*tampered, expired]:
            r = await aput(bad, content=body)
            assert r.status_code == 403, (bad, r.text)
        assert not object_path(cp, up["upload_id"], "h.txt").exists()
        assert (await aput(url, content=body)).status_code == 201
        assert (await agent.call("complete_upload", upload_id=up["upload_id"]))["state"] == "complete"


async def test_another_callers_upload_is_not_found_as_a_missing_one(local: Settings) -> None:
    async with running(local) as (_cp, server, alice):
        body = b"alice's"
        up = await uploaded(alice, "a.txt", body)
        async with caller(server.url, BOB) as bob:
            theirs = await bob.error("complete_upload", upload_id=up["upload_id"])
            missing = await bob.error("complete_upload", upload_id="upl_" + "0" * 24)
            assert theirs == missing and theirs["code"] == "NOT_FOUND"
            again = await created(bob, "a.txt", body)
            assert again["upload_id"] != up["upload_id"] and not again["resumed"]
        assert (await alice.call("complete_upload", upload_id=up["upload_id"]))["state"] == "complete"


async def test_expired_uploads_go_with_their_objects(local: Settings) -> None:
    async with running(local) as (cp, _server, agent):
        up = await uploaded(agent, "s.txt", b"short-lived")
        await agent.call("complete_upload", upload_id=up["upload_id"])
        half = await agent.call("create_upload", name="p.bin", size_bytes=6 * MIB, sha256="0" * 64)
        assert (await aput(half["plan"]["url"], content=b"x" * MIB,
                         headers={"Content-Range": f"bytes 0-{MIB - 1}/{6 * MIB}"})).status_code == 200
        swept = cp.reconciler.retention.sweep(time.time() + 1)
        assert swept.uploads_expired == 0, "nothing expires before its time"
        swept = cp.reconciler.retention.sweep(time.time() + local.upload_ttl_s + 1)
        assert swept.uploads_expired == 2
        assert not (cp.object_stores.default.root / "uploads" / up["upload_id"]).exists()  # type: ignore[attr-defined]
        assert not (cp.object_stores.default.root / "uploads" / half["upload_id"]).exists()  # type: ignore[attr-defined]
        assert cp.store.uploads.get(up["upload_id"]) is None


# ---- the cloud stores (moto's S3, the GCS emulator, azurite) -------------------------------------
def cloud_settings(home: Path, target: CloudTarget) -> Settings:
    return Settings(home=home, **FAST, auth_tokens=TOKENS, upload_single_max_bytes=5 * MIB,
                    object_store_url=target.url)


@pytest.fixture
def on_s3(home: Path, moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    target = s3_target(moto_server)
    for k, v in target.env.items():
        monkeypatch.setenv(k, v)
    return cloud_settings(home, target)


FORMS = {"s3": "s3_multipart", "gcs": "gcs_resumable", "azure": "azure_blocks"}


async def test_put_to_a_cloud_store_in_one_request_and_resumed_in_its_native_form(
        home: Path, cloud: CloudTarget, tmp_path: Path) -> None:
    # Not .json: the GCS emulator parses a body sent as application/json (GCS itself stores it).
    small, big = tmp_path / "small.csv", tmp_path / "big.bin"
    make_file(small, 2000)
    big_sha = make_file(big, 12 * MIB + 5)
    async with running(cloud_settings(home, cloud)) as (cp, server, agent):
        objects = cp.object_stores.default
        upload_id = reference(await put(server.url, small, token=ALICE))
        assert objects.get_bytes(f"uploads/{upload_id}/small.csv") == small.read_bytes()

        first = await agent.call("create_upload", name="big.bin", size_bytes=big.stat().st_size, sha256=big_sha)
        plan = first["plan"]
        assert plan["form"] == FORMS[cloud.name], plan
        head = big.read_bytes()[: 5 * MIB]
        if cloud.name == "gcs":  # the session the control plane opened takes the first chunk, then stop
            assert plan["chunk_bytes"] == 5 * MIB and plan["received_bytes"] == 0
            r = await aput(plan["url"], content=head, headers={"Content-Range": f"bytes 0-{5 * MIB - 1}/{12 * MIB + 5}"})
            assert r.status_code == 308, r.text
            said = f"{5 * MIB} bytes already there"
        else:  # one part (or block), then stop
            assert plan["part_count"] == 3 and plan["part_size"] == 5 * MIB
            assert [p["part_number"] for p in plan["parts"]] == [1, 2, 3]
            if cloud.name == "azure":  # azurite checks SAS signatures (moto and the GCS emulator do not)
                forged = re.sub(r"sig=[^&]+", "sig=AAAA", plan["parts"][0]["url"])
                assert (await aput(forged, content=head)).status_code == 403
            r = await aput(plan["parts"][0]["url"], content=head)
            assert r.status_code in (200, 201), r.text
            said = "1 parts already there"
        assert (await agent.error("complete_upload", upload_id=first["upload_id"]))["code"] == "UPLOAD_INCOMPLETE"
        done = await put(server.url, big, token=ALICE)
        assert reference(done) == first["upload_id"]
        assert "resuming" in done.stderr and said in done.stderr, done.stderr
        with objects.open(f"uploads/{first['upload_id']}/big.bin") as f:
            sha = hashlib.sha256()
            while b := f.read(MIB):
                sha.update(b)
        assert sha.hexdigest() == big_sha
        assert (await agent.call("complete_upload", upload_id=first["upload_id"]))["state"] == "complete"


SIGNED_HEADERS = {"s3": "X-Amz-SignedHeaders", "gcs": "X-Goog-SignedHeaders"}


async def test_a_single_put_carries_the_content_type_asked_for(home: Path, cloud: CloudTarget) -> None:
    """create_upload's content type is in the plan's headers and, on S3 and GCS, among the
    headers the URL's signature covers (so a PUT that sends another type is refused there: Azure's
    SAS cannot require a header); the object ends up with it."""
    from urllib.parse import parse_qs, urlsplit

    body = b"a,b\n1,2\n"
    async with running(cloud_settings(home, cloud)) as (cp, _server, agent):
        up = await agent.call("create_upload", name="t.csv", size_bytes=len(body),
                              sha256=hashlib.sha256(body).hexdigest(), content_type="text/x-test-table")
        plan = up["plan"]
        assert plan["form"] == "single", plan
        headers = {k.lower(): v for k, v in plan["headers"].items()}
        type_header = "x-ms-blob-content-type" if cloud.name == "azure" else "content-type"
        assert headers.get(type_header) == "text/x-test-table", plan["headers"]
        if cloud.name in SIGNED_HEADERS:
            signed = parse_qs(urlsplit(plan["url"]).query)[SIGNED_HEADERS[cloud.name]][0].split(";")
            assert "content-type" in signed, signed
        r = await aput(plan["url"], content=body, headers=plan["headers"])
        assert r.status_code in (200, 201), r.text
        assert (await agent.call("complete_upload", upload_id=up["upload_id"]))["content_type"] == "text/x-test-table"
        info = cp.object_stores.default.stat(f"uploads/{up['upload_id']}/t.csv")
        assert info is not None and info.content_type == "text/x-test-table", info


async def test_s3_parts_that_are_not_the_file_are_refused_and_deleted(on_s3: Settings) -> None:
    async with running(on_s3) as (cp, _server, agent):
        size = 6 * MIB
        up = await agent.call("create_upload", name="w.bin", size_bytes=size, sha256=hashlib.sha256(b"\0" * size).hexdigest())
        parts = up["plan"]["parts"]
        assert (await aput(parts[0]["url"], content=b"\1" * (5 * MIB))).status_code == 200
        assert (await aput(parts[1]["url"], content=b"\0" * MIB)).status_code == 200
        err = await agent.error("complete_upload", upload_id=up["upload_id"])
        assert err["code"] == "UPLOAD_MISMATCH", err
        assert list(cp.object_stores.default.list(f"uploads/{up['upload_id']}/")) == []


# ---- controlplane get -------------------------------------------------------------------------------
async def get(server_url: str, ref: str, out: Path, token: str = ALICE) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "get", ref, "-o", str(out), "--url", server_url, "--token", token],
        env={**user_env(), "COLUMNS": "200"}, cwd=ROOT, capture_output=True, text=True, timeout=300))


async def test_get_downloads_an_artifact_checked_and_resumes_a_partial_one(local: Settings, tmp_path: Path) -> None:
    async with running(local) as (_cp, server, agent):
        task_id = await agent.submit("exercise", inputs={"artifact_bytes": 3 * MIB + 7})
        assert (await agent.wait(task_id))["state"] == "succeeded"
        result = await agent.call("get_task_result", task_id=task_id)
        want = result["result"]["artifact_sha256"]
        ref = f"artifact://{task_id}/data.bin"

        whole = tmp_path / "whole.bin"
        done = await get(server.url, ref, whole)
        assert done.returncode == 0, done.stderr
        assert sha_of(whole) == want and not (tmp_path / "whole.bin.part").exists()

        resumed = tmp_path / "resumed.bin"  # an earlier run stopped after its first MiB
        (tmp_path / "resumed.bin.part").write_bytes(whole.read_bytes()[:MIB])
        again = await get(server.url, ref, resumed)
        assert again.returncode == 0 and f"resuming at byte {MIB}" in again.stderr, again.stderr
        assert sha_of(resumed) == want

        spoiled = tmp_path / "spoiled.bin"  # a leftover that is not the artifact's start
        (tmp_path / "spoiled.bin.part").write_bytes(b"\0" * MIB)
        bad = await get(server.url, ref, spoiled)
        assert bad.returncode == 1 and "not the artifact" in bad.stderr, bad.stderr
        assert not spoiled.exists() and not (tmp_path / "spoiled.bin.part").exists()
        assert (await get(server.url, ref, spoiled)).returncode == 0 and sha_of(spoiled) == want

        assert (await get(server.url, f"artifact://{task_id}/missing.bin", tmp_path / "m")).returncode == 1
        theirs = await get(server.url, ref, tmp_path / "bob.bin", token=BOB)
        assert theirs.returncode == 1 and "NOT_FOUND" in theirs.stderr
