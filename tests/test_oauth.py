"""OAuth 2.1 resource server, end to end: a throwaway OpenID provider on 127.0.0.1 (`tests/oidc.py`)
issues the tokens, the real HTTP server checks them, and real MCP clients of both eras call it
(`mode="auto"` negotiates 2026-07-28, `mode="legacy"` 2025-11-25).

What a client sees: good tokens work; every kind of bad token gets 401 with a challenge naming
the metadata document and the scopes to ask for; a token without the scope an operation needs
gets 403 `insufficient_scope` naming that scope; the metadata document is RFC 9728's; keys
rotate; opaque tokens go through introspection. Whatever is refused creates nothing."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, serving
from tests.oidc import INTROSPECTION_CLIENT, FakeIdP
from tests.wire import LEGACY, Legacy, modern_request

pytestmark = pytest.mark.anyio

OWN = ["tasks:submit", "tasks:read", "tasks:cancel"]
CHALLENGE_SCOPE = 'scope="tasks:submit tasks:read tasks:cancel"'


def oauth_settings(home: Path, idp: FakeIdP, **extra: Any) -> Settings:
    # No JWKS URI: it is discovered from the issuer's OpenID configuration.
    return Settings(home=home, auth_issuer=idp.issuer, auth_jwks_refresh_s=0.3, **{**FAST, **extra})


@pytest.fixture
async def server(home: Path, idp: FakeIdP) -> AsyncIterator[Any]:
    cp = ControlPlane(oauth_settings(home, idp, auth_tokens="static-token=ci-bot"))
    async with serving(cp) as srv:
        srv.cp = cp
        yield srv


def task_count(cp: ControlPlane) -> int:
    return sum(cp.store.tasks.count_by_state().values())


def submit_body(tool: str = "submit_task", **args: Any) -> tuple[dict[str, Any], dict[str, str]]:
    if tool == "submit_task":
        args = {"tool_name": "exercise", "inputs": {}, **args}
    return modern_request("tools/call", {"name": tool, "arguments": args})


async def post(url: str, token: str | None, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    if token is not None:
        headers = {**headers, "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient() as h:
        return await h.post(url, json=body, headers=headers, timeout=30)


def challenge(r: httpx.Response) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer k="v", ...` header."""
    value = r.headers["www-authenticate"]
    assert value.startswith("Bearer"), value
    out = {}
    for part in value[len("Bearer"):].split('",'):
        k, _, v = part.strip().partition("=")
        if k:
            out[k] = v.strip().strip('"')
    return out


# ---- good tokens --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_valid_token_runs_a_task_end_to_end(server: Any, idp: FakeIdP, mode: str) -> None:
    token = idp.token("alice", audience=server.url, scopes=OWN)
    async with Client(server.url, auth=token, mode=mode) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 2, "artifact_bytes": 100, "result": {"ok": 1}})
        assert (await agent.wait(tid))["state"] == "succeeded"  # the runner's callbacks went through
        result = await agent.call("get_task_result", task_id=tid)
        assert result["result"]["ok"] == 1
        # The signed download link needs no token: its signature is its credential.
        async with httpx.AsyncClient() as h:
            r = await h.get(result["artifacts"][0]["download_url"])
        assert r.status_code == 200 and len(r.content) == 100
    # The owner is the issuer and the subject.
    assert server.cp.store.tasks.get(tid).owner == f"{idp.issuer}#alice"


async def test_static_tokens_still_work_beside_oauth(server: Any) -> None:
    async with Client(server.url, auth="static-token") as client:
        agent = Agent(client)
        tid = await agent.submit()
        assert (await agent.call("get_task_status", task_id=tid))["task_id"] == tid
    assert server.cp.store.tasks.get(tid).owner == "ci-bot"


async def test_the_same_subject_is_the_same_owner_in_both_eras(server: Any, idp: FakeIdP) -> None:
    async with Client(server.url, auth=idp.token("alice", audience=server.url, scopes=OWN), mode="legacy") as c:
        tid = await Agent(c).submit()
    # A fresh token of the same subject, another era: the same caller, so the same task.
    async with Client(server.url, auth=idp.token("alice", audience=server.url, scopes=OWN), mode="auto") as c:
        assert (await Agent(c).call("get_task_status", task_id=tid))["task_id"] == tid
    async with Client(server.url, auth=idp.token("mallory", audience=server.url, scopes=OWN)) as c:
        assert (await Agent(c).error("get_task_status", task_id=tid))["code"] == "NOT_FOUND"


# ---- bad tokens: 401 ----------------------------------------------------------------------------------
def bad_tokens(idp: FakeIdP, url: str) -> dict[str, str]:
    from tests.oidc import Key

    stranger = Key("k1-stranger")  # not published: the kid is unknown to the JWKS
    good = idp.token("alice", audience=url, scopes=OWN)
    head, payload, sig = good.split(".")
    claims = json.loads(__import__("base64").urlsafe_b64decode(payload + "=="))
    forged = idp.encode({"alg": "RS256", "typ": "JWT", "kid": idp.current.kid},
                        {**claims, "sub": "root"}).decode() + "." + sig  # alice's signature on root's claims
    now = int(time.time())
    return {
        "wrong issuer": idp.token("alice", audience=url, scopes=OWN, iss="https://evil.example.com"),
        "wrong audience": idp.token("alice", audience="https://other.example.com/mcp", scopes=OWN),
        "no audience": idp.token("alice", audience=None, scopes=OWN),
        "bad signature": forged,
        "signed by another key": idp.token("alice", audience=url, scopes=OWN, key=stranger,
                                 header={"kid": idp.current.kid}),  # claims the published kid, signed by another key
        "expired": idp.token("alice", audience=url, scopes=OWN, iat=now - 7200, exp=now - 3600),
        "not yet valid": idp.token("alice", audience=url, scopes=OWN, nbf=now + 3600),
        "no expiry": idp.token("alice", audience=url, scopes=OWN, exp=None),
        "no subject": idp.token(None, audience=url, scopes=OWN),  # type: ignore[arg-type]
        "alg none": idp.unsigned("alice", audience=url, scopes=OWN),
        "HS256 keyed with the public key": idp.hs256_with_public_key("alice", audience=url, scopes=OWN),
        "not a token": "not-a-jwt",
    }


async def test_bad_tokens_get_401_with_a_challenge_and_create_nothing(server: Any, idp: FakeIdP) -> None:
    metadata = server.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    # Without a token: the challenge that starts a client's sign-in (no error attribute).
    r = await post(server.url, None, *submit_body())
    assert r.status_code == 401
    assert challenge(r) == {"scope": "tasks:submit tasks:read tasks:cancel", "resource_metadata": metadata}
    # The good token works (so every refusal below is the token's doing).
    r = await post(server.url, idp.token("alice", audience=server.url, scopes=OWN), *modern_request("tools/list"))
    assert r.status_code == 200

    for why, token in bad_tokens(idp, server.url).items():
        for body, headers in (submit_body(), submit_body("exercise"), modern_request("tools/list")):
            r = await post(server.url, token, body, headers)
            assert r.status_code == 401, (why, r.status_code, r.text)
            c = challenge(r)
            assert c["error"] == "invalid_token" and c["resource_metadata"] == metadata, why
            assert CHALLENGE_SCOPE in r.headers["www-authenticate"], why
            assert token not in r.text and "Traceback" not in r.text and "alice" not in r.text, why
        # The 2025-11-25 era is refused the same way, at its very first request.
        legacy = Legacy(httpx.AsyncClient(), server.url, token)
        r = await legacy.http.post(server.url, json=legacy.body("initialize", {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}),
            headers=legacy.headers())
        await legacy.http.aclose()
        assert r.status_code == 401 and challenge(r)["error"] == "invalid_token", why
        # And fastmcp's client gets nowhere in either era.
        for mode in ("auto", "legacy"):
            with pytest.raises(Exception):  # noqa: B017 - what matters is that nothing was created
                async with Client(server.url, auth=token, mode=mode) as client:
                    await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {}})
    assert task_count(server.cp) == 0


# ---- scopes: 403 --------------------------------------------------------------------------------------
async def test_a_missing_scope_gets_403_naming_it_and_creates_nothing(server: Any, idp: FakeIdP) -> None:
    owner = idp.token("alice", audience=server.url, scopes=OWN)
    async with Client(server.url, auth=owner) as client:
        tid = await Agent(client).submit(inputs={"sleep_s": 60})
    reader = idp.token("alice", audience=server.url, scopes=["tasks:read"])
    nothing = idp.token("alice", audience=server.url, scopes=[])
    metadata = server.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    tasks_meta = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    cases = [  # (token, request, the scope it lacks)
        (reader, submit_body(), "tasks:submit"),
        (reader, submit_body("exercise"), "tasks:submit"),  # a catalog tool submits too
        (reader, submit_body("cancel_task", task_id=tid), "tasks:cancel"),
        (reader, modern_request("tasks/cancel", {"taskId": tid}, meta=tasks_meta), "tasks:cancel"),
        (reader, modern_request("prompts/get", {"name": "exercise", "arguments": {}}), "tasks:submit"),
        (nothing, submit_body("get_task_status", task_id=tid), "tasks:read"),
        (nothing, submit_body("list_tasks"), "tasks:read"),
        (nothing, submit_body("wait_task", task_id=tid, timeout_s=1), "tasks:read"),
        (reader, submit_body("submit_sweep", tool_name="exercise", base_inputs={}, vary={"list": [{}]}),
         "tasks:submit"),
        (reader, submit_body("cancel_sweep", sweep_id="swp_x"), "tasks:cancel"),
        (nothing, submit_body("get_sweep_status", sweep_id="swp_x"), "tasks:read"),
        (nothing, submit_body("get_sweep_result", sweep_id="swp_x"), "tasks:read"),
        (nothing, submit_body("wait_sweep", sweep_id="swp_x", timeout_s=1), "tasks:read"),
        (nothing, modern_request("tasks/get", {"taskId": tid}, meta=tasks_meta), "tasks:read"),
        (nothing, modern_request("resources/read", {"uri": f"task://{tid}"}), "tasks:read"),
        (nothing, modern_request("subscriptions/listen", {"notifications": {"resourceSubscriptions": [f"task://{tid}"]}}),
         "tasks:read"),
        (nothing, modern_request("completion/complete", {"ref": {"type": "ref/resource", "uri": "task://{task_id}"},
                                                         "argument": {"name": "task_id", "value": "tsk_"}}),
         "tasks:read"),
        (nothing, modern_request("io.github.mcp-controlplane/completion", {
            "ref": {"type": "ref/tool", "name": "get_task_status"}, "argument": {"name": "task_id", "value": ""}}),
         "tasks:read"),
    ]
    for token, (body, headers), lacking in cases:
        r = await post(server.url, token, body, headers)
        assert r.status_code == 403, (body["method"], r.status_code, r.text)
        c = challenge(r)
        assert c["error"] == "insufficient_scope" and c["scope"] == lacking, (body["method"], c)
        assert c["resource_metadata"] == metadata
        assert r.json()["error"] == "insufficient_scope"
    # Discovery needs no scope; what the token does hold works.
    assert (await post(server.url, nothing, *modern_request("tools/list"))).status_code == 200
    r = await post(server.url, reader, *submit_body("get_task_status", task_id=tid))
    assert r.status_code == 200 and json.loads(r.text)["result"]["structuredContent"]["state"] != "cancelled"
    for tool in ("get_sweep_status", "wait_sweep"):  # a reader follows sweeps: the tool answers (NOT_FOUND here)
        r = await post(server.url, reader, *submit_body(tool, sweep_id="swp_x"))
        assert r.status_code == 200 and "NOT_FOUND" in r.text, (tool, r.text)

    # The 2025-11-25 era: the scope is read from the body.
    legacy = Legacy(httpx.AsyncClient(), server.url, reader)
    await legacy.start()
    r = await legacy.http.post(server.url, headers=legacy.headers(), json=legacy.body(
        "tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "inputs": {}}}))
    assert r.status_code == 403 and challenge(r)["scope"] == "tasks:submit"
    r = await legacy.http.post(server.url, headers=legacy.headers(), json=legacy.body(
        "tools/call", {"name": "cancel_task", "arguments": {"task_id": tid}}))
    assert r.status_code == 403 and challenge(r)["scope"] == "tasks:cancel"
    assert (await legacy.request("tools/call", {"name": "get_task_status", "arguments": {"task_id": tid}}))["result"]
    await legacy.http.aclose()
    legacy = Legacy(httpx.AsyncClient(), server.url, nothing)  # discovery works; subscribing reads a task
    await legacy.start()
    assert "tools" in (await legacy.request("tools/list"))["result"]
    r = await legacy.http.post(server.url, headers=legacy.headers(), json=legacy.body(
        "resources/subscribe", {"uri": f"task://{tid}"}))
    assert r.status_code == 403 and challenge(r)["scope"] == "tasks:read"
    await legacy.http.aclose()

    # fastmcp's client with a read-only token cannot submit, in either era.
    for mode in ("auto", "legacy"):
        async with Client(server.url, auth=reader, mode=mode) as client:
            with pytest.raises(Exception):  # noqa: B017
                await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {}})
    assert task_count(server.cp) == 1
    assert server.cp.store.tasks.get(tid).cancel_requested is False


async def test_routing_headers_cannot_dress_up_an_operation(server: Any, idp: FakeIdP) -> None:
    """2026-07-28: the gate reads the operation from Mcp-Method/Mcp-Name; the SDK refuses a
    request whose headers differ from its body, so a read-only token cannot cancel by saying it
    only reads."""
    owner = idp.token("alice", audience=server.url, scopes=OWN)
    async with Client(server.url, auth=owner) as client:
        tid = await Agent(client).submit(inputs={"sleep_s": 60})
    reader = idp.token("alice", audience=server.url, scopes=["tasks:read"])
    body, headers = submit_body("cancel_task", task_id=tid)
    for lie in ({"Mcp-Name": "get_task_status"}, {"Mcp-Method": "tools/list"}):
        r = await post(server.url, reader, body, {**headers, **lie})
        assert r.status_code in (200, 400), r.text
        assert r.json()["error"]["code"] == -32020, r.text  # header mismatch: nothing ran
    assert server.cp.store.tasks.get(tid).cancel_requested is False


async def test_tasks_admin_stands_in_for_read_and_cancel_but_not_submit(server: Any, idp: FakeIdP) -> None:
    admin = idp.token("root", audience=server.url, scopes=["tasks:admin"])
    r = await post(server.url, admin, *submit_body("list_tasks"))
    assert r.status_code == 200
    r = await post(server.url, admin, *submit_body())
    assert r.status_code == 403 and challenge(r)["scope"] == "tasks:submit"


# ---- the metadata document ------------------------------------------------------------------------
async def test_the_protected_resource_metadata_is_rfc_9728s(server: Any, idp: FakeIdP) -> None:
    base = server.url.removesuffix("/mcp")
    async with httpx.AsyncClient() as h:
        r401 = await h.post(server.url, json={})
        path_form = await h.get(challenge(r401)["resource_metadata"])  # where the challenge points
        root_form = await h.get(base + "/.well-known/oauth-protected-resource")  # clients' fallback
        health = await h.get(base + "/healthz")
    assert challenge(r401)["resource_metadata"] == base + "/.well-known/oauth-protected-resource/mcp"
    for r in (path_form, root_form):
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        doc = r.json()
        assert doc["resource"] == server.url  # exactly the endpoint clients dial: no trailing slash
        assert doc["authorization_servers"] == [idp.issuer]  # exactly the issuer (RFC 8414 discovery)
        assert doc["scopes_supported"] == ["tasks:submit", "tasks:read", "tasks:cancel", "tasks:admin"]
        assert doc["bearer_methods_supported"] == ["header"]
        assert set(doc) <= {"resource", "authorization_servers", "scopes_supported", "bearer_methods_supported",
                            "resource_name", "resource_documentation", "jwks_uri"}
    assert health.status_code == 200  # the server's own routes need no token


# ---- keys -----------------------------------------------------------------------------------------
async def test_keys_rotate_and_a_withdrawn_key_is_refused(server: Any, idp: FakeIdP) -> None:
    old = idp.current
    old_token = idp.token("alice", audience=server.url, scopes=OWN)
    list_call = submit_body("list_tasks")
    assert (await post(server.url, old_token, *list_call)).status_code == 200
    fetches = idp.jwks_fetches

    new = idp.rotate()  # publish a new key, withdraw the old one
    new_token = idp.token("alice", audience=server.url, scopes=OWN, key=new)
    assert (await post(server.url, old_token, *list_call)).status_code == 200  # verified before: still good
    await anyio.sleep(0.35)  # past the least interval between two fetches
    assert (await post(server.url, new_token, *list_call)).status_code == 200  # unknown kid: the set is read again
    assert idp.jwks_fetches == fetches + 1
    # The old key is gone from the set just read: its tokens are refused from now on.
    r = await post(server.url, idp.token("alice", audience=server.url, scopes=OWN, key=old), *list_call)
    assert r.status_code == 401 and challenge(r)["error"] == "invalid_token"

    # Tokens naming unknown keys cannot make the server hammer the provider: one fetch per interval.
    from tests.oidc import Key

    stray_key = Key("stray")
    strays = [idp.token("alice", audience=server.url, scopes=OWN, key=stray_key, header={"kid": f"stray-{i}"})
              for i in range(20)]
    await anyio.sleep(0.35)
    fetches = idp.jwks_fetches
    answers: list[int] = []

    async def present(token: str) -> None:
        answers.append((await post(server.url, token, *list_call)).status_code)

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for token in strays:
            tg.start_soon(present, token)
    assert answers == [401] * 20
    assert idp.jwks_fetches - fetches <= 1 + int((time.monotonic() - started) / 0.3), idp.jwks_fetches - fetches


SIGNING_KEYS = [("RS256", {}), ("RS384", {}), ("RS512", {}), ("PS256", {}), ("PS512", {}), ("ES256", {}),
                ("ES384", {}), ("ES512", {}), ("EdDSA", {}), ("EdDSA", {"curve": "Ed448"}),
                ("ES256", {"declare_alg": False}), ("PS384", {"declare_alg": False}), ("EdDSA", {"declare_alg": False})]


async def test_every_asymmetric_algorithm_the_jwks_declares_is_accepted_bound_to_its_key(
        server: Any, idp: FakeIdP) -> None:
    """One JWKS with an RSA, EC (each curve) and OKP key each, some declaring `alg`, some not: a
    token signed by each with its algorithm lists tasks (a real client, both eras); the
    confusion attacks are refused with 401 and create nothing."""
    keys = {f"{alg}{kw}": idp.rotate(alg, keep_old=True, **kw) for alg, kw in SIGNING_KEYS}
    idp.rotate("ES256", keep_old=True, use="enc")  # a key for encryption signs nothing
    for name, key in keys.items():
        for mode in ("auto", "legacy"):
            async with Client(server.url, auth=idp.token("alice", audience=server.url, scopes=OWN, key=key),
                              mode=mode) as client:
                assert (await Agent(client).call("list_tasks"))["tasks"] == [], (name, mode)
    # a key that does not declare its algorithm is still bound to its type (and an EC key to its curve)
    undeclared_rsa = keys["PS384{'declare_alg': False}"]
    r = await post(server.url, idp.sign({"alg": "RS256", "typ": "JWT", "kid": undeclared_rsa.kid},
                                        idp.claims("bob", audience=server.url, scopes=OWN), undeclared_rsa, "RS256"),
                   *submit_body("list_tasks"))
    assert r.status_code == 200, r.text[:200]

    rsa, ec256, ed = keys["RS256{}"], keys["ES256{}"], keys["EdDSA{}"]
    claims = idp.claims("mallory", audience=server.url, scopes=OWN)
    attacks = {
        "alg none": idp.unsigned("mallory", audience=server.url, scopes=OWN),
        "HS256 keyed with the RSA public key": idp.hs256_with_public_key("mallory", audience=server.url, scopes=OWN,
                                                                         key=rsa),
        "HS256 keyed with the EC public key": idp.hs256_with_public_key("mallory", audience=server.url, scopes=OWN,
                                                                        key=ec256),
        "HS256 keyed with the raw Ed25519 key": idp.hs256_with_public_key(
            "mallory", audience=server.url, scopes=OWN, key=ed, secret=__import__("base64").urlsafe_b64decode(
                ed.jwk["x"] + "==")),
        "ES256 header on an RSA key": idp.sign({"alg": "ES256", "typ": "JWT", "kid": rsa.kid}, claims, ec256),
        "RS256 header on an EC key": idp.sign({"alg": "RS256", "typ": "JWT", "kid": ec256.kid}, claims, rsa),
        "PS256 on a key declaring RS256": idp.sign({"alg": "PS256", "typ": "JWT", "kid": rsa.kid}, claims, rsa, "PS256"),
        "ES384 header on a P-256 key": idp.sign({"alg": "ES384", "typ": "JWT", "kid": ec256.kid}, claims, ec256),
        "EdDSA header on an EC key": idp.sign({"alg": "EdDSA", "typ": "JWT", "kid": ec256.kid}, claims, ed),
        "signed by the encryption key": idp.token("mallory", audience=server.url, scopes=OWN),
        "a critical header": idp.token("mallory", audience=server.url, scopes=OWN, key=ec256,
                                       header={"crit": ["exp"], "b64": True}),
    }
    before = task_count(server.cp)
    for name, token in attacks.items():
        r = await post(server.url, token, *submit_body())
        assert r.status_code == 401, (name, r.status_code, r.text[:200])
        assert challenge(r)["error"] == "invalid_token", name
    assert task_count(server.cp) == before


async def test_a_token_trusted_from_before_is_refused_once_it_expires(server: Any, idp: FakeIdP) -> None:
    """Verified JWTs are remembered for a while (the signature check is most of what OAuth costs a
    call), but never past their exp."""
    token = idp.token("alice", audience=server.url, scopes=OWN, lifetime_s=2)
    list_call = submit_body("list_tasks")
    assert (await post(server.url, token, *list_call)).status_code == 200
    assert (await post(server.url, token, *list_call)).status_code == 200
    await anyio.sleep(2.5)
    r = await post(server.url, token, *list_call)
    assert r.status_code == 401 and challenge(r)["error"] == "invalid_token"


# ---- opaque tokens ------------------------------------------------------------------------------------
async def test_opaque_tokens_are_introspected_and_runner_secrets_never_are(home: Path, idp: FakeIdP) -> None:
    client_id, secret = INTROSPECTION_CLIENT
    settings = oauth_settings(home, idp, auth_jwks_uri=idp.jwks_uri, auth_introspection_url=idp.introspection_url,
                              auth_introspection_client_id=client_id, auth_introspection_client_secret=secret)
    cp = ControlPlane(settings)
    async with serving(cp) as srv:
        good = idp.opaque_token("alice", audience=srv.url, scopes=OWN)
        async with Client(srv.url, auth=good) as client:
            agent = Agent(client)
            tid = await agent.submit(inputs={"log_lines": 3})
            assert (await agent.wait(tid))["state"] == "succeeded"
        assert cp.store.tasks.get(tid).owner == f"{idp.issuer}#alice"
        for token in (idp.opaque_token("alice", audience=srv.url, scopes=OWN, active=False),
                      idp.opaque_token("alice", audience="https://other.example.com/mcp", scopes=OWN),
                      "opaque-never-issued"):
            r = await post(srv.url, token, *modern_request("tools/list"))
            assert r.status_code == 401 and challenge(r)["error"] == "invalid_token"
        reader = idp.opaque_token("alice", audience=srv.url, scopes=["tasks:read"])
        r = await post(srv.url, reader, *submit_body())
        assert r.status_code == 403 and challenge(r)["scope"] == "tasks:submit"
        # JWTs are still checked locally, never sent to the introspection endpoint.
        jwt = idp.token("bob", audience=srv.url, scopes=OWN)
        assert (await post(srv.url, jwt, *modern_request("tools/list"))).status_code == 200
    # The provider heard only of the agents' tokens: not of the JWT, and not of the runner's
    # bootstrap token or callback secret, which the task's job sent on every callback.
    assert idp.introspected and all(t.startswith("opaque-") for t in idp.introspected)
    assert jwt not in idp.introspected


# ---- configuration ------------------------------------------------------------------------------------
async def test_a_symmetric_algorithm_only_when_configured_with_its_secret(home: Path, idp: FakeIdP) -> None:
    import hashlib
    import hmac

    from controlplane.mcp.oauth import AuthConfigError, build_resource_server
    from tests.oidc import b64url

    with pytest.raises(AuthConfigError, match="CONTROLPLANE_AUTH_HS_SECRET"):
        build_resource_server(oauth_settings(home, idp, auth_algorithm="HS256"), "http://127.0.0.1:1")
    secret = "a-shared-secret-of-enough-length-for-hs256"
    cp = ControlPlane(oauth_settings(home, idp, auth_algorithm="HS256", auth_hs_secret=secret))
    async with serving(cp) as srv:
        signing_input = idp.encode({"alg": "HS256", "typ": "JWT"}, idp.claims("alice", audience=srv.url, scopes=OWN))
        hs = signing_input.decode() + "." + b64url(hmac.new(secret.encode(), signing_input, hashlib.sha256).digest())
        assert (await post(srv.url, hs, *submit_body("list_tasks"))).status_code == 200
        rs = idp.token("alice", audience=srv.url, scopes=OWN)  # signed by the provider's RSA key
        assert (await post(srv.url, rs, *submit_body("list_tasks"))).status_code == 401


def test_a_wrong_setup_stops_the_server_with_the_setting_to_fix(home: Path, idp: FakeIdP) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT, fast_env

    # An issuer that serves no discovery document: the JWKS cannot be found.
    env = fast_env(home, auth_issuer=idp.issuer + "/nothing-here")
    out = subprocess.run([sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http", "--port", "0"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "CONTROLPLANE_AUTH_JWKS_URI" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
