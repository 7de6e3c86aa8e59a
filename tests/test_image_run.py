"""The control plane's image, run without Docker the way a platform runs it: the wheel installed as
infra/controlplane/Dockerfile installs it (its extras), read-only for the image's unprivileged
USER, who runs the image's CMD with the image's ENV completed by what a Terraform module gives it
(settings, a token, a port, a key), in its WORKDIR, with nothing writable but the paths the AWS
module mounts on its read-only root file system, each as Fargate makes it: the image's own
directory, owner and mode where the image declares a VOLUME there, else a directory owned by root
0755. It answers /healthz and MCP calls with the bearer token. And the image and the modules
agree: the paths mounted are the image's VOLUMEs, made by its USER before they are declared, and
the commands the modules run instead of CMD are the installed wheel's.

Switching to the image's uid needs root (CI runs as root); elsewhere the run skips, unless
CONTROLPLANE_REQUIRE_IMAGE_RUN=1 or CI is set, where it fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client

from tests import dockerfile
from tests.cloud import free_port, stop
from tests.conftest import ROOT
from tests.installed import Built, Venv, install, interpreter, outside_the_checkout
from tests.test_images import CONTROL_PLANE, deployment_env

MODULES = ROOT / "terraform" / "modules"
AWS = MODULES / "aws" / "main.tf"
# Directories a VOLUME may name that the base image (python:3.11-slim) already has, and their mode.
BASE_IMAGE_DIRS = {"/tmp": 0o1777}
TOKEN = "image-run-token"


def server_container() -> str:
    """The AWS module's control-plane container definition, as text."""
    text = AWS.read_text()
    start = text.index("server_container = {")
    return text[start:text.index('resource "aws_ecs_task_definition" "server"', start)]


def mounted() -> list[str]:
    return re.findall(r'containerPath = "([^"]+)"', server_container())


def module_commands() -> dict[str, list[list[str]]]:
    """Every `command = [...]` each module runs in the image instead of its CMD."""
    return {cloud: [json.loads(found) for found in re.findall(r"\bcommand\s*=\s*(\[[^\]]*\])",
                                                               (MODULES / cloud / "main.tf").read_text())]
            for cloud in ("aws", "gcp", "azure")}


def test_the_aws_module_mounts_only_the_images_volumes_under_a_read_only_root() -> None:
    block = server_container()
    assert re.search(r"readonlyRootFilesystem\s*=\s*true", block)
    image_home = dockerfile.env(CONTROL_PLANE)["CONTROLPLANE_HOME"]
    assert image_home in mounted() and "/tmp" in mounted()
    assert sorted(set(mounted()) - set(dockerfile.volumes(CONTROL_PLANE))) == [], \
        "a path the module mounts is no VOLUME of the image: Fargate would make it root's, 0755"


@pytest.mark.parametrize("volume", dockerfile.volumes(CONTROL_PLANE))
def test_each_volume_of_the_image_is_its_users_to_write(volume: str) -> None:
    if volume in BASE_IMAGE_DIRS:
        assert BASE_IMAGE_DIRS[volume] & 0o1777 == 0o1777  # world-writable, sticky
        return
    made = dockerfile.made_before_volume(CONTROL_PLANE, volume)
    assert made, f"no RUN makes {volume} (install -d -o UID -g GID) before the VOLUME that declares it"
    assert made[:2] == dockerfile.user(CONTROL_PLANE)


def image_extras() -> str:
    runs = " ".join(rest for op, rest in dockerfile.final_stage(CONTROL_PLANE) if op == "RUN")
    found = re.search(r'pip install [^"]*"mcp-controlplane\[([\w,]+)\]"', runs)
    assert found, "the image's pip install of the wheel was not found"
    return found.group(1)


def require_root() -> None:
    if os.geteuid() == 0:
        return
    if os.environ.get("CONTROLPLANE_REQUIRE_IMAGE_RUN") == "1" or os.environ.get("CI"):
        pytest.fail("running as the image's uid needs root (CONTROLPLANE_REQUIRE_IMAGE_RUN=1 or CI)")
    pytest.skip("running as the image's uid needs root")


@pytest.fixture(scope="module")
def image_venv(built: Built) -> Iterator[Venv]:
    """The wheel with the image's extras in a fresh venv, on a Python the image's user can run.
    (tests/test_install.py's venv holds the wheel alone, as uvx installs it: the image's modules
    need the cloud extras, and the bare install must be tested without them.)"""
    require_root()
    uid, _ = dockerfile.user(CONTROL_PLANE)
    with outside_the_checkout("mcp-controlplane-image-") as root:
        yield install(built.wheel, root / "venv", image_extras(), interpreter(uid))


def test_the_commands_the_modules_run_are_the_installed_wheels(image_venv: Venv) -> None:
    commands = module_commands()
    assert all(commands.values()), commands
    for cloud, found in commands.items():
        for command in found:
            assert image_venv.bin(command[0]).is_file(), f"{cloud} runs {command}: not a command of the wheel"
    assert dockerfile.exec_form(CONTROL_PLANE, "CMD")[0] in {c[0] for found in commands.values() for c in found}


class Image:
    """The image's file system, laid out under a directory: the venv read-only, the WORKDIR a
    directory of root's (the read-only root file system), each mounted path as Fargate makes it."""

    def __init__(self, venv: Venv, root: Path) -> None:
        self.venv, self.root = venv, root
        self.uid, self.gid = dockerfile.user(CONTROL_PLANE)
        workdir = [rest for op, rest in dockerfile.final_stage(CONTROL_PLANE) if op == "WORKDIR"][-1]
        self.workdir = self.path(workdir)
        self.workdir.mkdir(parents=True)
        for mount in mounted():
            self.mount(mount)

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def mount(self, image_path: str) -> None:
        where = self.path(image_path)
        where.mkdir(parents=True, exist_ok=True)
        made = (dockerfile.made_before_volume(CONTROL_PLANE, image_path)
                if image_path in dockerfile.volumes(CONTROL_PLANE) else None)
        if made:
            os.chown(where, made[0], made[1])
            where.chmod(int(made[2], 8))
        elif image_path in dockerfile.volumes(CONTROL_PLANE) and image_path in BASE_IMAGE_DIRS:
            where.chmod(BASE_IMAGE_DIRS[image_path])
        else:
            where.chmod(0o755)  # Fargate's bind mount where the image declares no VOLUME

    def env(self, port: int, **extra: str) -> dict[str, str]:
        """The image's ENV, the settings the modules give every replica, and what a deployment
        provides (a key, a token, the catalog, its bucket), with the image's paths mapped here."""
        env = {"PATH": f"{self.venv.root / 'bin'}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "HOME": str(self.workdir), "TMPDIR": str(self.path("/tmp"))}
        env.update(dockerfile.env(CONTROL_PLANE))
        env.update(deployment_env())
        env.update({
            "CONTROLPLANE_HOME": str(self.path(env["CONTROLPLANE_HOME"])),
            "CONTROLPLANE_HOST": "127.0.0.1",  # the image binds 0.0.0.0; tests bind loopback
            "PORT": str(port),
            "CONTROLPLANE_PUBLIC_URL": f"http://127.0.0.1:{port}",
            "CONTROLPLANE_SECRET_KEY": "s" * 64,
            "CONTROLPLANE_AUTH_TOKENS": f"{TOKEN}=alice",
            # the module's bucket (jobs on grants need a store that signs uploads); not called here
            "CONTROLPLANE_OBJECT_STORE_URL": "s3://controlplane-objects",
            "AWS_DEFAULT_REGION": "us-east-1",
        })
        env.update(extra)
        return env

    def run_as_user(self, command: list[str], env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, env=env, cwd=self.workdir, user=self.uid, group=self.gid, extra_groups=[],
                              capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)

    def start_as_user(self, command: list[str], env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, cwd=self.workdir, user=self.uid, group=self.gid, extra_groups=[],
                                stdout=log, stderr=subprocess.STDOUT)


def test_the_image_serves_as_its_user_with_the_install_read_only_and_only_its_mounts_writable(
        image_venv: Venv) -> None:
    with outside_the_checkout("mcp-controlplane-image-fs-") as root:
        image = Image(image_venv, root)
        port = free_port()
        env = image.env(port)
        site = next(image_venv.root.glob("lib/python3*/site-packages"))

        # what the user cannot write: the install and the root file system
        for place in (site / "controlplane", image.workdir):
            refused = image.run_as_user(["python", "-c", f"open({str(place / 'x')!r}, 'w')"], env)
            assert refused.returncode != 0 and "PermissionError" in refused.stderr, (place, refused.stderr)

        export = image.run_as_user(["controlplane", "catalog", "export", str(site / "controlplane" / "default_catalog.toml"),
                                    "--default-image", "tools:1"], env)
        assert export.returncode == 0, export.stderr
        env["CONTROLPLANE_CATALOG_JSON"] = json.dumps(json.loads(export.stdout)["catalog"])

        # the one-shot migration the modules define (the same image, their command instead of CMD)
        [migrate] = {tuple(c) for found in module_commands().values() for c in found}
        migrated = image.run_as_user(list(migrate), env)
        assert migrated.returncode == 0, migrated.stderr
        home = Path(env["CONTROLPLANE_HOME"])
        assert (home / "controlplane.db").stat().st_uid == image.uid

        log_path = root / "server.log"  # root's, outside what the user may write
        with log_path.open("wb") as log:
            server = image.start_as_user(dockerfile.exec_form(CONTROL_PLANE, "CMD"), env, log)
        try:
            health = dockerfile.exec_form(CONTROL_PLANE, "HEALTHCHECK")
            deadline = time.monotonic() + 90
            while image.run_as_user(health, env, timeout=10).returncode != 0:
                assert server.poll() is None, log_path.read_text()[-4000:]
                assert time.monotonic() < deadline, "the image's health check never passed: " + log_path.read_text()[-4000:]
                time.sleep(0.3)
            assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200

            url = f"http://127.0.0.1:{port}/mcp"
            assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                              headers={"Accept": "application/json, text/event-stream"}).status_code == 401

            async def call() -> tuple[set[str], Any]:
                async with Client(url, auth=TOKEN) as client:
                    tools = {t.name for t in await client.list_tools()}
                    return tools, (await client.call_tool("list_tasks", {})).structured_content

            tools, listed = anyio.run(call)
            assert {"submit_task", "lj_relax", "exercise"} <= tools
            assert listed is not None and listed.get("tasks") == []
            assert server.poll() is None
        finally:
            stop(server)
        assert "Traceback" not in log_path.read_text(), log_path.read_text()[-4000:]
