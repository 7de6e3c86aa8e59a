"""What authorization costs a call: `get_task_status` over HTTP (2026-07-28, one client) against
three servers in this process, one without auth, one with a static bearer token and one taking
OAuth JWTs from a throwaway OpenID provider (`tests/oidc.py`), measured in interleaved rounds so
that the machine's drift falls on all three alike; and the verification of one JWT alone
(`OAuthTokens.verify_token`: signature, claims, identity), the first time and when it was
verified before (`CONTROLPLANE_AUTH_VERIFIED_CACHE_S`).

    python bench/auth.py [--calls 300] [--rounds 5]

Prints a table and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fastmcp import Client  # noqa: E402

from controlplane.app import ControlPlane  # noqa: E402
from controlplane.settings import Settings  # noqa: E402
from tests.conftest import FAST, serving  # noqa: E402
from tests.oidc import FakeIdP  # noqa: E402

OWN = ["tasks:submit", "tasks:read", "tasks:cancel"]


async def main(calls: int, rounds: int) -> dict[str, Any]:
    idp = FakeIdP().start()
    tmp = Path(tempfile.mkdtemp())
    setups = {
        "none": {},
        "static": {"auth_tokens": "static-token=alice"},
        "oauth": {"auth_issuer": idp.issuer, "auth_jwks_uri": idp.jwks_uri},
    }
    times: dict[str, list[float]] = {k: [] for k in setups}
    verify: dict[str, float] = {}
    async with serving(ControlPlane(Settings(home=tmp / "none", **FAST, **setups["none"]))) as none_srv, \
            serving(ControlPlane(Settings(home=tmp / "static", **FAST, **setups["static"]))) as static_srv, \
            serving(ControlPlane(Settings(home=tmp / "oauth", **FAST, **setups["oauth"]))) as oauth_srv:
        servers = {"none": (none_srv, None), "static": (static_srv, "static-token"),
                   "oauth": (oauth_srv, idp.token("alice", audience=oauth_srv.url, scopes=OWN, lifetime_s=3600))}
        clients = {}
        for name, (srv, token) in servers.items():
            clients[name] = await Client(srv.url, auth=token).__aenter__()
        task_ids = {}
        for name, client in clients.items():
            res = await client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {}})
            task_ids[name] = res.structured_content["task_id"]
            for _ in range(50):  # warm up
                await client.call_tool("get_task_status", {"task_id": task_ids[name]})
        for _ in range(rounds):
            for name, client in clients.items():
                for _ in range(calls // rounds):
                    t0 = time.perf_counter()
                    await client.call_tool("get_task_status", {"task_id": task_ids[name]})
                    times[name].append(time.perf_counter() - t0)
        for client in clients.values():
            await client.__aexit__(None, None, None)
        from controlplane.mcp.oauth import OAuthTokens

        token = servers["oauth"][1]
        for name, cache_s in (("jwt_verify_us", 0.0), ("jwt_verify_cached_us", 60.0)):
            tokens = OAuthTokens(Settings(home=tmp / "v", auth_verified_cache_s=cache_s, **setups["oauth"]),
                                 audience=oauth_srv.url, jwks_uri=idp.jwks_uri)
            await tokens.verify_token(token)
            n = 500
            t0 = time.perf_counter()
            for _ in range(n):
                assert await tokens.verify_token(token) is not None
            verify[name] = round((time.perf_counter() - t0) / n * 1e6, 1)
    idp.stop()
    out: dict[str, Any] = {}
    for name, ts in times.items():
        out[name] = {"p50_ms": round(statistics.median(ts) * 1000, 3), "mean_ms": round(statistics.fmean(ts) * 1000, 3)}
    out["static_over_none_p50"] = round(out["static"]["p50_ms"] / out["none"]["p50_ms"], 3)
    out["oauth_over_none_p50"] = round(out["oauth"]["p50_ms"] / out["none"]["p50_ms"], 3)
    out.update(verify)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    res = asyncio.run(main(a.calls, a.rounds))
    print(f"{'auth':8} {'p50 ms':>8} {'mean ms':>8}")
    for name in ("none", "static", "oauth"):
        print(f"{name:8} {res[name]['p50_ms']:8.3f} {res[name]['mean_ms']:8.3f}")
    print(f"static/none {res['static_over_none_p50']}x, oauth/none {res['oauth_over_none_p50']}x; "
          f"one JWT verified in {res['jwt_verify_us']} us ({res['jwt_verify_cached_us']} us when verified before)")
    print(json.dumps(res))
