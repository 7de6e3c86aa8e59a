"""The control plane's image and the Terraform modules that deploy it agree: the port each module
sends traffic to and probes is the image's, the health path is the one its HEALTHCHECK asks, and
the image's own command, run from this venv's installed package with the image's environment
completed by the one every module sets (modules/settings), comes up healthy on an empty
PostgreSQL database with no manual step: two replicas started at once both migrate-or-wait under
the advisory lock and serve. (The file system a platform gives the container, and the user it
runs as, are what only a real build and run can check.)
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from fastmcp import Client

from controlplane.store.db import Database
from tests import dockerfile
from tests.cloud import free_port, stop
from tests.conftest import ROOT
from tests.postgres import Cluster, require_or_skip
from tests.test_images import CONTROL_PLANE, VENV_BIN, deployment_env, image_env

MODULES = ROOT / "terraform" / "modules"
PORT_OF = {  # where each module names the container port its traffic and probes go to
    "aws": [r"containerPort = (\d+)", r"container_port\s+= (\d+)", r'health_check \{\s*path\s+= "([^"]+)"'],
    "gcp": [r"container_port = (\d+)", r'http_get \{\s*path = "([^"]+)"'],
    "azure": [r"target_port\s+= (\d+)", r"port\s+= (\d+)\s+path\s+= \"([^\"]+)\""],
}


@pytest.mark.parametrize("cloud", sorted(PORT_OF))
def test_each_module_sends_traffic_and_probes_to_the_images_port_and_health_path(cloud: str) -> None:
    text = (MODULES / cloud / "main.tf").read_text()
    image_port = dockerfile.env(CONTROL_PLANE)["PORT"]
    assert [rest for op, rest in dockerfile.final_stage(CONTROL_PLANE) if op == "EXPOSE"] == [image_port]
    [health] = [rest for op, rest in dockerfile.final_stage(CONTROL_PLANE) if op == "HEALTHCHECK"]
    image_path = re.search(r"http://127\.0\.0\.1:%s(/\w+)", health)
    assert image_path
    seen = set()
    for pattern in PORT_OF[cloud]:
        found = re.findall(pattern, text)
        assert found, f"{cloud}: {pattern!r} not in main.tf"
        for match in found:
            for value in (match if isinstance(match, tuple) else (match,)):
                seen.add(value)
                assert value in (image_port, image_path.group(1)), f"{cloud}: {value} is neither the image's port nor its health path"
    assert {image_port, image_path.group(1)} <= seen


def test_the_modules_migrate_at_start() -> None:
    assert deployment_env()["CONTROLPLANE_MIGRATE_ON_START"] == "true"


@pytest.fixture
def empty_pg_url(pg: Cluster | None) -> Iterator[str]:
    """A PostgreSQL database with nothing in it (the modules deploy PostgreSQL only)."""
    if pg is None:
        require_or_skip("its binaries (initdb, postgres) were not found")
    assert pg is not None
    name = pg.empty_database()
    try:
        yield pg.url(name)
    finally:
        pg.drop(name)


def test_two_replicas_on_an_empty_database_migrate_once_and_both_serve(tmp_path: Path, empty_pg_url: str) -> None:
    """What the first apply does: the service's replicas start together on a database nothing
    has migrated. Each answers the image's HEALTHCHECK and lists the catalog's tools."""
    empty_db_url = empty_pg_url
    export = subprocess.run([str(VENV_BIN / "controlplane"), "catalog", "export",
                             str(ROOT / "controlplane" / "default_catalog.toml"), "--default-image", "tools:1"],
                            capture_output=True, text=True, check=True)
    catalog = json.dumps(json.loads(export.stdout)["catalog"])
    serve = dockerfile.exec_form(CONTROL_PLANE, "CMD")
    health = dockerfile.exec_form(CONTROL_PLANE, "HEALTHCHECK")
    ports = [free_port(), free_port()]
    envs = [image_env(tmp_path / f"r{i}", empty_db_url, port, catalog) for i, port in enumerate(ports)]
    servers = [subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for env in envs]
    try:
        deadline = time.monotonic() + 90
        for server, env in zip(servers, envs, strict=True):
            while subprocess.run(health, env=env, capture_output=True, timeout=10).returncode != 0:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "a replica's health check never passed"
                time.sleep(0.3)

        async def tools(port: int) -> set[str]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return {t.name for t in await client.list_tools()}

        for port in ports:
            assert {"exercise", "lj_relax", "submit_task"} <= anyio.run(tools, port)
        db = Database(empty_db_url)
        try:
            assert db.current_revision() is not None
            db.require_current()
        finally:
            db.dispose()
    finally:
        for server in servers:
            stop(server)
