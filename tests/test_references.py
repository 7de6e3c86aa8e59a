"""Inputs by reference, as an agent uses them through a real MCP client on the local provider: an
upload (`create_upload`, PUT, `complete_upload`) handed to a tool whose schema marks a file field,
the tool reading a local file its runner fetched and checked; a chain of tasks each reading the
previous one's artifact by `artifact://`; what admission refuses (another caller's object
answers NOT_FOUND exactly as a missing one, files that cannot fit the scratch disk); an input
that cannot be read (INPUTS_UNREADABLE, its reason in the log only); retention keeping an expired
upload, or a task's artifact, that a task which can still run refers to; and a chain of three
with the store on the GCS emulator and on azurite, and on AWS Batch on moto with moto's S3."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.objectstore.base import open_store
from controlplane.references import file_fields
from controlplane.settings import Settings
from controlplane.states import TaskState
from controlplane.store import NewTask
from controlplane.store.inputs import InputRow
from tests import aws
from tests.aws import moto  # noqa: F401  (fixture)
from tests.cloud import CloudTarget, azurite_server, cloud, gcs_server, moto_server  # noqa: F401  (fixtures)
from tests.conftest import FAST, Agent, catalog_text, serving
from tests.test_uploads import aput

pytestmark = pytest.mark.anyio
MIB = 1024 * 1024

DIGEST = '''
[tools.digest]
description = "A test tool: the size and sha256 of a file input, and a copy of it as an artifact."
provider = "local"
resource_class = "cpu_small"
command = ["{python}", "-m", "controlplane_tools.digest"]
estimate_s = 1
max_input_file_mb = 1
retry = { max_attempts = 1 }

[tools.digest.input_schema]
type = "object"
required = ["data"]
properties.data = { type = "string", "x-controlplane-file" = true }
properties.suffix = { type = "string" }
'''


@pytest.fixture
def settings(home: Path) -> Settings:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text() + DIGEST)
    return Settings(home=home, **FAST, auth_tokens="tok-a=alice,tok-b=bob")


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[ControlPlane, Any, Agent]]:
    cp = ControlPlane(settings)
    async with serving(cp) as server, Client(server.url, auth="tok-a") as client:
        yield cp, server, Agent(client)


async def upload(agent: Agent, name: str, body: bytes, complete: bool = True) -> str:
    """An upload made as a client makes it; its reference."""
    up = await agent.call("create_upload", name=name, size_bytes=len(body), sha256=hashlib.sha256(body).hexdigest())
    assert (await aput(up["plan"]["url"], content=body)).status_code == 201
    if complete:
        await agent.call("complete_upload", upload_id=up["upload_id"])
    return str(up["reference"])


async def result(agent: Agent, task_id: str) -> dict[str, Any]:
    st = await agent.wait(task_id)
    assert st["state"] == "succeeded", (st.get("error"), [ln["message"] for ln in (await agent.call("tail_task_logs", task_id=task_id))["lines"]])
    return (await agent.call("get_task_result", task_id=task_id))["result"]  # type: ignore[no-any-return]


def test_a_file_field_is_a_marked_string_property(settings: Settings) -> None:
    from controlplane.catalog import Catalog

    tool = Catalog.load(settings.home / "catalog.toml").tool("digest")
    assert tool is not None and file_fields(tool.input_schema) == ["data"]


async def test_an_upload_then_a_chain_of_artifacts_reach_the_tools_as_local_files(settings: Settings) -> None:
    body = hashlib.sha256(b"refs").digest() * 4096  # 128 KiB
    async with running(settings) as (_cp, _server, agent):
        ref = await upload(agent, "input.bin", body)
        first = await agent.submit("digest", inputs={"data": ref, "suffix": "+1"})
        got = await result(agent, first)
        assert got == {"size_bytes": len(body), "sha256": hashlib.sha256(body).hexdigest(), "path_is_local": True}
        # A chain: each task reads the previous one's artifact.
        second = await agent.submit("digest", inputs={"data": f"artifact://{first}/out.bin", "suffix": "+2"})
        third_body = body + b"+1+2"
        got2 = await result(agent, second)
        assert got2["size_bytes"] == len(body) + 2 and got2["sha256"] == hashlib.sha256(body + b"+1").hexdigest()
        third = await agent.submit("digest", inputs={"data": f"artifact://{second}/out.bin"})
        got3 = await result(agent, third)
        assert got3["sha256"] == hashlib.sha256(third_body).hexdigest()


async def test_references_admission_refuses(settings: Settings) -> None:
    async with running(settings) as (_cp, server, alice):
        ref = await upload(alice, "a.bin", b"alice's bytes")
        pending = await upload(alice, "p.bin", b"not yet complete", complete=False)
        big = await upload(alice, "big.bin", b"x" * (MIB + 1))
        done = await alice.submit("exercise", inputs={"artifact_names": ["out.txt"]})
        assert (await alice.wait(done))["state"] == "succeeded"
        async with Client(server.url, auth="tok-b") as c:
            bob = Agent(c)
            theirs = await bob.error("submit_task", tool_name="digest", inputs={"data": ref})
            missing = await bob.error("submit_task", tool_name="digest", inputs={"data": "upload://upl_" + "0" * 24})
            assert theirs == missing and theirs["code"] == "NOT_FOUND", theirs
            art = await bob.error("submit_task", tool_name="digest", inputs={"data": f"artifact://{done}/out.txt"})
            no_art = await bob.error("submit_task", tool_name="digest",
                                     inputs={"data": "artifact://tsk_00000000000000000000/out.txt"})
            assert art == no_art and art["code"] == "NOT_FOUND", art
        assert (await alice.error("submit_task", tool_name="digest", inputs={"data": pending}))["code"] == "NOT_FOUND"
        assert (await alice.error("submit_task", tool_name="digest",
                                  inputs={"data": f"artifact://{done}/absent.txt"}))["code"] == "NOT_FOUND"
        mine = await alice.submit("digest", inputs={"data": f"artifact://{done}/out.txt"})
        assert (await alice.wait(mine))["state"] == "succeeded"
        too_big = await alice.error("submit_task", tool_name="digest", inputs={"data": big})
        assert too_big["code"] == "INVALID_REQUEST" and "inputs.data" in too_big["message"], too_big
        for bad in ("/etc/passwd", "https://example.com/x.bin", "s3://bucket/key"):
            err = await alice.error("submit_task", tool_name="digest", inputs={"data": bad})
            assert err["code"] == "INVALID_REQUEST" and "inputs.data" in err["message"], err


async def test_an_input_that_cannot_be_read_ends_the_task_with_a_fixed_documented_error(settings: Settings) -> None:
    """The runner refuses bytes other than admission recorded: the client sees INPUTS_UNREADABLE
    and a fixed message; what the runner met is in the task's log only."""
    async with running(settings) as (cp, _server, agent):
        ref = await upload(agent, "t.bin", b"the bytes admission saw")
        row = cp.store.uploads.get(ref.removeprefix("upload://"))
        assert row is not None  # changed in the store once complete (admission reads the row, not the bytes)
        cp.object_stores.get(row.store_url).put_bytes(row.storage_key, b"tampered after completion", overwrite=True)
        tid = await agent.submit("digest", inputs={"data": ref})
        st = await agent.wait(tid)
        assert st["state"] == "failed", st
        assert st["error"] == {"code": "INPUTS_UNREADABLE", "message": "the task's inputs could not be read before "
                               "the tool started (the task's log says why)"}, st["error"]
        assert (await agent.call("get_task_result", task_id=tid))["error"] == st["error"]
        lines = [ln["message"] for ln in await agent.all_logs(tid)]
        assert any(ln.startswith("cannot read inputs: InputMismatch: input data:") for ln in lines), lines


async def test_input_files_must_fit_the_scratch_disk(home: Path) -> None:
    """The files a submit refers to live on its job's scratch disk: more than the task's
    `resources.scratch_mb`, or than its resource class allows, is refused with the sizes."""
    home.mkdir(parents=True, exist_ok=True)
    big_tool = DIGEST.replace("[tools.digest", "[tools.digest_big").replace("max_input_file_mb = 1", "max_input_file_mb = 8")
    (home / "catalog.toml").write_text(catalog_text() + big_tool + "\n[resource_classes.tiny_disk]\nmax_concurrency = 1\n"
                                       "max_queue_length = 10\ncpu = 1\nmemory_mb = 512\nscratch_mb = 2\n")
    async with running(Settings(home=home, **FAST, auth_tokens="tok-a=alice")) as (_cp, _server, agent):
        ref = await upload(agent, "big.bin", b"x" * (3 * MIB + 1))
        asked = await agent.error("submit_task", tool_name="digest_big", inputs={"data": ref},
                                  resources={"scratch_mb": 2})
        assert asked["code"] == "INVALID_REQUEST", asked
        assert asked["message"] == (f"the input files take {3 * MIB + 1} bytes (4 MiB: inputs.data {3 * MIB + 1} "
                                    "bytes), more than resources.scratch_mb=2"), asked
        assert "at least 4" in asked["hint"]
        capped = await agent.error("submit_task", tool_name="digest_big", inputs={"data": ref},
                                   resources={"resource_class": "tiny_disk"})
        assert capped["code"] == "INVALID_REQUEST" and "resource class 'tiny_disk'" in capped["message"], capped
        # Nothing asked and no cap: admitted (the job's disk is the provider's default).
        ok = await agent.submit("digest_big", inputs={"data": ref})
        assert (await result(agent, ok))["size_bytes"] == 3 * MIB + 1


async def test_an_operator_allowed_url_prefix_is_a_reference(settings: Settings, tmp_path: Path) -> None:
    allowed = settings.model_copy(update={"input_url_prefixes": "https://data.example.org/public/"})
    async with running(allowed) as (_cp, _server, alice):
        ok = await alice.call("submit_task", tool_name="digest",
                              inputs={"data": "https://data.example.org/public/x.bin"})
        assert ok["task_id"]
        err = await alice.error("submit_task", tool_name="digest", inputs={"data": "https://data.example.org/private/x"})
        assert err["code"] == "INVALID_REQUEST"
        await alice.call("cancel_task", task_id=ok["task_id"])


async def test_an_expired_upload_stays_while_a_task_that_can_run_refers_to_it(settings: Settings) -> None:
    body = b"kept for the child"
    async with running(settings) as (cp, _server, agent):
        ref = await upload(agent, "k.bin", body)
        upload_id = ref.removeprefix("upload://")
        parent = await agent.submit("exercise", inputs={"sleep_s": 2})
        child = await agent.submit("digest", inputs={"data": ref}, after=[parent])
        assert (await agent.call("get_task_status", task_id=child))["state"] == "waiting"
        later = time.time() + settings.upload_ttl_s + 1
        assert cp.reconciler.retention.sweep(later).uploads_expired == 0
        assert cp.store.uploads.get(upload_id) is not None
        assert (await result(agent, child))["sha256"] == hashlib.sha256(body).hexdigest()
        assert cp.reconciler.retention.sweep(later).uploads_expired == 1, "gone once no task can run"
        assert cp.store.uploads.get(upload_id) is None


async def test_an_expired_task_stays_while_a_task_that_can_run_refers_to_its_artifact(settings: Settings) -> None:
    """Retention's sweep past the source task's ttl leaves it (and the artifact's object) while
    a waiting child refers to the artifact; the child then reads it, and the next sweep expires
    the source."""
    async with running(settings) as (cp, _server, agent):
        source = await agent.submit("exercise", inputs={"artifact_names": ["out.txt"]}, ttl_s=60)
        assert (await agent.wait(source))["state"] == "succeeded"
        blocker = await agent.submit("exercise", inputs={"sleep_s": 2})
        child = await agent.submit("digest", inputs={"data": f"artifact://{source}/out.txt"}, after=[blocker])
        assert (await agent.call("get_task_status", task_id=child))["state"] == "waiting"
        art = next(a for a in cp.store.artifacts.of(source) if a.name == "out.txt")
        objects = cp.object_stores.get(art.store_url)
        later = time.time() + 61
        swept = cp.reconciler.retention.sweep(later)
        assert (await agent.call("get_task_status", task_id=source))["state"] == "succeeded", swept
        assert objects.stat(art.storage_key) is not None
        assert (await result(agent, child))["size_bytes"] == art.size_bytes
        cp.reconciler.retention.sweep(later)
        assert (await agent.call("get_task_status", task_id=source))["state"] == "expired", "gone once no task can run"
        assert objects.stat(art.storage_key) is None


async def test_an_artifact_of_a_running_parent_is_resolved_when_the_child_is_released(settings: Settings) -> None:
    async with running(settings) as (_cp, _server, agent):
        parent = await agent.submit("exercise", inputs={"sleep_s": 1.5, "artifact_names": ["out.txt"]})
        child = await agent.submit("digest", inputs={"data": f"artifact://{parent}/out.txt"}, after=[parent])
        orphan = await agent.submit("digest", inputs={"data": f"artifact://{parent}/never.txt"}, after=[parent])
        assert (await agent.call("get_task_status", task_id=child))["state"] == "waiting"
        assert (await result(agent, child))["path_is_local"] is True
        st = await agent.wait(orphan)
        assert st["state"] == "failed" and st["error"]["code"] == "DEPENDENCY_FAILED", st
        assert "never.txt" in st["error"]["message"] and st["error"]["parent"] == parent
        # Not named in `after`, an artifact that does not exist yet is not found at once.
        other = await agent.submit("exercise", inputs={"sleep_s": 5})
        err = await agent.error("submit_task", tool_name="digest", inputs={"data": f"artifact://{other}/out.txt"})
        assert err["code"] == "NOT_FOUND"
        await agent.call("cancel_task", task_id=other)


async def test_an_artifact_of_a_parent_that_no_longer_fits_the_scratch_disk_ends_the_child(home: Path) -> None:
    """Admitted before the parent wrote it (no size yet), the artifact is measured when the child
    is released: past its class's cap (or the task's resources.scratch_mb, where its provider
    takes one: the same check), the child ends DEPENDENCY_FAILED naming the parent, the artifact
    and the sizes; with room, it runs."""
    home.mkdir(parents=True, exist_ok=True)
    big_tool = DIGEST.replace("[tools.digest", "[tools.digest_big").replace("max_input_file_mb = 1", "max_input_file_mb = 8")
    (home / "catalog.toml").write_text(catalog_text() + big_tool + "\n[resource_classes.tiny_disk]\nmax_concurrency = 1\n"
                                       "max_queue_length = 10\ncpu = 1\nmemory_mb = 512\nscratch_mb = 2\n")
    size = 3 * MIB + 1
    async with running(Settings(home=home, **FAST, auth_tokens="tok-a=alice")) as (cp, _server, agent):
        parent = await agent.submit("exercise", inputs={"sleep_s": 1.5, "artifact_bytes": size})
        ref = {"data": f"artifact://{parent}/data.bin"}
        capped = await agent.submit("digest_big", inputs=ref, after=[parent], resources={"resource_class": "tiny_disk"})
        roomy = await agent.submit("digest_big", inputs=ref, after=[parent])  # its class has no cap
        assert (await agent.call("get_task_status", task_id=capped))["state"] == "waiting"  # admitted: no size yet
        assert (await result(agent, roomy))["size_bytes"] == size
        st = await agent.wait(capped)
        assert st["state"] == "failed", st
        room = "the 2 MiB of scratch disk resource class 'tiny_disk' allows"
        assert st["error"] == {
            "code": "DEPENDENCY_FAILED", "parent": parent, "parent_state": "succeeded", "artifact": "data.bin",
            "message": f"parent task {parent} succeeded with the artifact data.bin of {size} bytes, and the input "
                       f"files take {size} bytes (4 MiB: inputs.data {size} bytes), more than {room}: this task "
                       "will not run",
            "hint": "ask for resources.scratch_mb of at least 4 plus what the tool writes, or pass smaller files"}
        # Admitted while its parent ran, written once it had ended (a submit racing the parent's
        # end): its own transaction resolves the artifact and checks it the same way.
        raced = cp.store.tasks.submit(NewTask(
            owner="alice", tool_name="digest_big", inputs_json=json.dumps(ref), input_size=None, provider="local",
            resource_class="tiny_disk", priority=0, ttl_s=3600, idempotency_key=None, tags=[], resources_json="{}",
            max_runtime_s=60, max_attempts=1, estimate_s=1.0, after=(parent,),
            refs=(InputRow(field="data", kind="artifact", ref=ref["data"], store_url="", storage_key="",
                           size_bytes=None, sha256=None),))).task
        assert raced.state == TaskState.FAILED and json.loads(raced.error_json or "{}") == st["error"]


async def test_an_artifact_of_a_parent_larger_than_the_tool_takes_ends_the_child(home: Path) -> None:
    """An artifact admitted without a size (its parent still ran) is held to the tool's
    `max_input_file_mb` when the child is released, as a submit's known files are at admission."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text() + DIGEST)  # digest: max_input_file_mb = 1
    size = 2 * MIB
    async with running(Settings(home=home, **FAST, auth_tokens="tok-a=alice")) as (_cp, _server, agent):
        parent = await agent.submit("exercise", inputs={"sleep_s": 1.0, "artifact_bytes": size})
        child = await agent.submit("digest", inputs={"data": f"artifact://{parent}/data.bin"}, after=[parent])
        st = await agent.wait(child)
        assert st["state"] == "failed", st
        assert st["error"] == {
            "code": "DEPENDENCY_FAILED", "parent": parent, "parent_state": "succeeded", "artifact": "data.bin",
            "message": f"parent task {parent} succeeded with the artifact data.bin of {size} bytes, and inputs.data "
                       "may be at most 1 MiB (tool 'digest', max_input_file_mb): this task will not run",
            "hint": "pass a smaller file, or ask the operator for a tool that takes larger ones"}


# ---- the store on the GCS emulator and on azurite (the job on the local provider) -----------------
@pytest.mark.parametrize("cloud", ["gcs", "azure"], indirect=True)
async def test_an_upload_and_an_artifact_are_read_through_gcs_and_azure(home: Path, cloud: CloudTarget) -> None:
    """The object store is the point: an upload sent by its plan, then a chain of three tasks each
    reading the previous one's artifact, every file fetched by the runner from that store."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text() + DIGEST)
    body = hashlib.sha256(cloud.name.encode()).digest() * 2048  # 64 KiB
    async with running(Settings(home=home, **FAST, auth_tokens="tok-a=alice", object_store_url=cloud.url)) \
            as (cp, _server, agent):
        up = await agent.call("create_upload", name="in.bin", size_bytes=len(body),
                              sha256=hashlib.sha256(body).hexdigest())
        assert up["plan"]["form"] == "single"
        r = await aput(up["plan"]["url"], content=body, headers=up["plan"].get("headers") or {})
        assert r.status_code in (200, 201), r.text
        await agent.call("complete_upload", upload_id=up["upload_id"])
        row = cp.store.uploads.get(up["upload_id"])
        assert row is not None and open_store(cloud.url).stat(row.storage_key) is not None  # in that store
        first = await agent.submit("digest", inputs={"data": up["reference"], "suffix": "1"})
        second = await agent.submit("digest", inputs={"data": f"artifact://{first}/out.bin", "suffix": "2"},
                                    after=[first])
        third = await agent.submit("digest", inputs={"data": f"artifact://{second}/out.bin"}, after=[second])
        assert (await result(agent, first))["sha256"] == hashlib.sha256(body).hexdigest()
        assert (await result(agent, second))["sha256"] == hashlib.sha256(body + b"1").hexdigest()
        assert (await result(agent, third))["sha256"] == hashlib.sha256(body + b"12").hexdigest()
        art = next(a for a in cp.store.artifacts.of(second) if a.name == "out.bin")
        assert open_store(cloud.url).stat(art.storage_key) is not None


# ---- on a cloud fake: AWS Batch on moto, the store on moto's S3 ----------------------------------
@pytest.mark.parametrize("access", ["identity", "grants"])
async def test_an_upload_and_an_artifact_reach_a_batch_job_through_s3(moto: str, home: Path, access: str) -> None:  # noqa: F811
    """With the job's own identity, or with no credential at all (`grants`): then the control
    plane signs a GET for each file input (`inputs/<field>`)."""
    import secrets

    from tests.test_job_grants import CLOUD_VARS

    name = f"cp-{secrets.token_hex(5)}"
    aws.client("s3", moto).create_bucket(Bucket=name)
    aws.batch_catalog(home)
    on_batch = DIGEST.replace('provider = "local"\nresource_class = "cpu_small"',
                              'provider = "aws_batch"\nresource_class = "batch"')
    (home / "catalog.toml").write_text((home / "catalog.toml").read_text() + on_batch)
    cp = ControlPlane(Settings(home=home, object_store_url=f"s3://{name}/runs", job_store_access=access, **FAST))
    body = hashlib.sha256(b"on s3").digest() * 1000

    def job_env(env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if access == "identity" or not k.startswith(CLOUD_VARS)}

    with aws.BatchExecutor(moto, job_env=job_env) as executor:
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            up = await agent.call("create_upload", name="in.bin", size_bytes=len(body),
                                  sha256=hashlib.sha256(body).hexdigest())
            assert up["plan"]["form"] == "single"
            async with httpx.AsyncClient() as h:
                r = await h.put(up["plan"]["url"], content=body, headers=up["plan"].get("headers") or {})
                assert r.status_code in (200, 201), r.text
            await agent.call("complete_upload", upload_id=up["upload_id"])
            first = await agent.submit("digest", inputs={"data": up["reference"], "suffix": "!"})
            second = await agent.submit("digest", inputs={"data": f"artifact://{first}/out.bin", "suffix": "?"},
                                        after=[first])
            third = await agent.submit("digest", inputs={"data": f"artifact://{second}/out.bin"}, after=[second])
            assert (await result(agent, first))["sha256"] == hashlib.sha256(body).hexdigest()
            assert (await result(agent, second))["sha256"] == hashlib.sha256(body + b"!").hexdigest()
            assert (await result(agent, third))["sha256"] == hashlib.sha256(body + b"!?").hexdigest()
            for tid in (first, second, third):
                env = executor.envs[f"cp-{tid.removeprefix('tsk_')}-a1"]
                assert (env.get("CONTROLPLANE_STORE_ACCESS") == "grants") == (access == "grants")
                assert env.get("CONTROLPLANE_INPUT_FILES") == "1"  # it has file inputs: the runner reads them
