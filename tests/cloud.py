"""Offline stand-ins for the clouds, started and stopped by the tests, all on 127.0.0.1:
moto's server for S3, gcp-storage-emulator for GCS, azurite for Azure Blob.

Each `*_env` fixture yields a `CloudTarget`: a fresh bucket (or container) with a store URL, and
the environment variables that point SDKs at the emulator. Tests put those variables in
os.environ, so that runner processes started by the local provider inherit them, as a job
inherits its identity in the cloud.

azurite comes from npm. Where it is not installed the Azure tests are skipped, unless
CONTROLPLANE_REQUIRE_EMULATORS=1 (set by .ci/run), which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class CloudTarget:
    name: str
    url: str  # the object store URL, with a prefix
    env: dict[str, str] = field(default_factory=dict)
    signing_key: dict | None = None  # GCS: the service-account key links are signed with


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def require_or_skip(what: str) -> None:
    if os.environ.get("CONTROLPLANE_REQUIRE_EMULATORS") == "1":
        pytest.fail(f"{what} is required (CONTROLPLANE_REQUIRE_EMULATORS=1) but not installed")
    pytest.skip(f"{what} not installed (npm install azurite; .ci/run does)")


# ---- the emulators, as context managers (the benchmark uses these too) -----------------------
@contextmanager
def moto_s3() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def gcs_emulator() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "-H", "127.0.0.1", "--port",
                             str(port), "--in-memory"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def azurite_binary() -> str | None:
    candidates = [os.environ.get("AZURITE_BLOB"), shutil.which("azurite-blob"),
                  str(ROOT / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob")]
    return next((c for c in candidates if c and Path(c).exists()), None)


@contextmanager
def azurite(data_dir: Path) -> Iterator[str]:
    binary = azurite_binary()
    if binary is None:
        raise FileNotFoundError("azurite-blob")
    port = free_port()
    proc = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data_dir),
                             "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    finally:
        stop(proc)


# ---- servers, one per test session --------------------------------------------------------------
@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    with moto_s3() as url:
        yield url


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    with gcs_emulator() as url:
        yield url


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if azurite_binary() is None:
        require_or_skip("azurite")
    with azurite(tmp_path_factory.mktemp("azurite")) as url:
        yield url


def service_account_key() -> dict:
    """A service-account key made here, as GCS would issue one: links are signed offline with it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "controlplane-test", "private_key_id": secrets.token_hex(8),
            "private_key": pem, "client_email": "signer@controlplane-test.iam.gserviceaccount.com",
            "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}


# ---- per test: a fresh bucket or container ----------------------------------------------------
def s3_target(moto_server: str) -> CloudTarget:
    import boto3

    env = {**AWS_ENV, "AWS_ENDPOINT_URL_S3": moto_server}
    bucket = f"cp-{secrets.token_hex(6)}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing-secret").create_bucket(Bucket=bucket)
    return CloudTarget("s3", f"s3://{bucket}/runs", env)


def gcs_target(gcs_server: str, key_dir: Path) -> CloudTarget:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    bucket = f"cp-{secrets.token_hex(6)}"
    storage.Client(project="controlplane-test", credentials=AnonymousCredentials(),
                   client_options={"api_endpoint": gcs_server}).create_bucket(bucket)
    key = service_account_key()
    key_file = key_dir / "signer.json"
    key_file.write_text(json.dumps(key))
    env = {"STORAGE_EMULATOR_HOST": gcs_server, "GOOGLE_CLOUD_PROJECT": "controlplane-test",
           "CONTROLPLANE_GCS_SIGNING_KEY_FILE": str(key_file)}
    return CloudTarget("gcs", f"gs://{bucket}/runs", env, signing_key=key)


def azure_target(azurite_server: str) -> CloudTarget:
    from azure.storage.blob import BlobServiceClient

    container = f"cp-{secrets.token_hex(6)}"
    BlobServiceClient(azurite_server, credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
                      ).create_container(container)
    env = {"AZURE_STORAGE_BLOB_ENDPOINT": azurite_server, "AZURE_STORAGE_KEY": AZURITE_KEY}
    return CloudTarget("azure", f"az://{AZURITE_ACCOUNT}/{container}/runs", env)


@pytest.fixture(params=["s3", "gcs", "azure"])
def cloud(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CloudTarget:
    """Each cloud object store in turn, its SDK pointed at its emulator through the environment."""
    if request.param == "s3":
        target = s3_target(request.getfixturevalue("moto_server"))
    elif request.param == "gcs":
        target = gcs_target(request.getfixturevalue("gcs_server"), tmp_path)
    else:
        target = azure_target(request.getfixturevalue("azurite_server"))
    for k, v in target.env.items():
        monkeypatch.setenv(k, v)
    return target


@pytest.fixture
def azure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> CloudTarget:
    """Azure Blob alone (azurite), for what only azurite can show: it checks SAS signatures."""
    target = azure_target(request.getfixturevalue("azurite_server"))
    for k, v in target.env.items():
        monkeypatch.setenv(k, v)
    return target


# ---- catalogs that run the exercise tool on a cloud runner ---------------------------------------
def exercise_catalog(home: Path, *, provider: str, resource_class: str, resources: str, options: str,
                     retry: str = "{ max_attempts = 1 }", reachable_stores: tuple[str, ...] = (),
                     command: tuple[str, ...] = ("{python}", "-m", "controlplane_tools.exercise")) -> None:
    """Write the default catalog with `exercise` moved to `provider`, in a resource class of its
    own (`resources`: its TOML lines; `options`: its provider_options, inline; `reachable_stores`:
    the stores its jobs reach beyond their cloud's, such as "file://" for a fake's jobs on this host;
    `command`: the tool's command, for a test that wants a cheaper one)."""
    from controlplane.catalog import default_catalog_text

    text = default_catalog_text()
    old = ('provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]\n'
           "default_runtime_s = 300\nmax_runtime_s = 3600\nestimate_s = 1\nretry = { max_attempts = 1 }")
    assert old in text
    where = f'provider = "{provider}"'
    if reachable_stores:
        where = f'placements = [{{ provider = "{provider}", reachable_stores = {json.dumps(list(reachable_stores))} }}]'
    text = text.replace(old, f'{where}\nresource_class = "{resource_class}"\ncommand = {json.dumps(list(command))}\n'
                             f"default_runtime_s = 300\nmax_runtime_s = 3600\nestimate_s = 1\nretry = {retry}")
    text += f"\n[resource_classes.{resource_class}]\n{resources}\nprovider_options = {{ {options} }}\n"
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(text)


async def run_without_callback(home: Path, store_url: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """One task run to success by a control plane that its runners cannot reach (a dead callback
    URL): they leave their events in the object store, and the attempt ends when the provider
    reports the job ended. Its final status."""
    from fastmcp import Client

    from controlplane.app import ControlPlane
    from controlplane.mcp.server import build_server
    from controlplane.settings import Settings
    from tests.conftest import FAST, Agent

    cp = ControlPlane(Settings(home=home, object_store_url=store_url, public_url="http://127.0.0.1:9", **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        st = await agent.wait(await agent.submit(inputs=inputs), timeout=90)
    assert st["state"] == "succeeded", st
    return st


def usage_of(ran_s: float, cpu: float, memory_gib: float) -> dict[str, Any]:
    """The usage an answer shows for `ran_s` seconds of one job of that shape (to a millisecond)."""
    return {"run_seconds": pytest.approx(ran_s, abs=0.001), "vcpu_seconds": pytest.approx(cpu * ran_s, abs=0.002),
            "memory_gib_seconds": pytest.approx(memory_gib * ran_s, abs=0.002), "gpu_seconds": 0}
