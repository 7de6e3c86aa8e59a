"""What users install is what this suite tests: the sdist and the wheel, built as PyPI gets them
(`python -m build`, isolated), pass `twine check`, the wheel holds every module and data file of
the source folders under their installed names and the license, and installed non-editable in a
fresh venv outside the checkout it runs `demo` to success from a directory outside the checkout
with a relative home, and serves MCP over stdio to the SDK's client, under both of its commands
(`controlplane`, and `mcp-controlplane` for `uvx mcp-controlplane` and `pipx`)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from packaging.metadata import Metadata

from controlplane import __version__
from tests.conftest import ROOT
from tests.installed import Built, Venv

# Each source folder and the import name it installs as (pyproject.toml's package-dir).
SOURCES = {"controlplane": "controlplane", "providers": "controlplane_providers",
           "infra/runner": "controlplane_runner", "infra/tools": "controlplane_tools"}
NOT_PACKAGED = {"Dockerfile"}  # an image's build file lives beside the code it installs
# The canonical Apache License 2.0 text (apache.org's LICENSE-2.0.txt), byte for byte.
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
COMMANDS = ["controlplane", "mcp-controlplane"]
DIST_INFO = f"mcp_controlplane-{__version__}.dist-info"


def source_files() -> set[str]:
    """Every file of the source folders, as the path it must have in the wheel."""
    found = set()
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc" \
                    and path.name not in NOT_PACKAGED:
                found.add(f"{package}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


def test_twine_check_passes(built: Built) -> None:
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(built.wheel), str(built.sdist)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_wheel_holds_every_module_and_data_file_of_the_source_folders_and_nothing_else(built: Built) -> None:
    names = set(zipfile.ZipFile(built.wheel).namelist())
    code = {n for n in names if not n.startswith(DIST_INFO + "/")}
    assert sorted(source_files() - code) == [], "left out of the wheel"
    assert sorted(code - source_files()) == [], "in the wheel, not in the source folders"
    # nothing at the top of site-packages but the prefixed import names
    assert {n.split("/")[0] for n in code} == set(SOURCES.values())


def test_the_wheel_and_sdist_carry_the_license_and_the_metadata_publishing_needs(built: Built) -> None:
    license_text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(license_text).hexdigest() == APACHE_2_SHA256
    wheel = zipfile.ZipFile(built.wheel)
    assert wheel.read(f"{DIST_INFO}/licenses/LICENSE") == license_text
    with tarfile.open(built.sdist) as sdist:
        member = sdist.extractfile(f"mcp_controlplane-{__version__}/LICENSE")
        assert member is not None and member.read() == license_text

    meta = Metadata.from_email(wheel.read(f"{DIST_INFO}/METADATA"), validate=True)
    assert meta.name == "mcp-controlplane" and str(meta.version) == __version__
    assert meta.license_expression == "Apache-2.0" and meta.license_files == ["LICENSE"]
    assert meta.description_content_type == "text/markdown"
    home = "https://github.com/mcp-controlplane/mcp-controlplane"
    assert meta.project_urls and all(url.startswith(home) for url in meta.project_urls.values())
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(meta.project_urls)
    assert meta.classifiers and "Programming Language :: Python :: 3.11" in meta.classifiers
    scripts = wheel.read(f"{DIST_INFO}/entry_points.txt").decode()
    for command in COMMANDS:
        assert f"{command} = controlplane.cli:app" in scripts


def run(venv: Venv, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv.bin(args[0])), *args[1:]], cwd=cwd, env=venv.env(), capture_output=True,
                          text=True, timeout=timeout)


def test_the_installed_package_is_the_venvs_and_says_its_version(installed: Venv, tmp_path: Path) -> None:
    where = run(installed, tmp_path, "python", "-c", "import controlplane, controlplane_providers, "
                "controlplane_runner, controlplane_tools as t; print(controlplane.__file__); print(t.__file__)")
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(installed.root) for line in where.stdout.split()), where.stdout
    for command in COMMANDS:
        shown = run(installed, tmp_path, command, "--version")
        assert (shown.returncode, shown.stdout.strip()) == (0, f"mcp-controlplane {__version__}"), shown.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_demo_runs_from_the_wheel_outside_the_checkout_with_a_relative_home(
        installed: Venv, tmp_path: Path, command: str) -> None:
    # README's first command as is for `controlplane`; a smaller cluster for the second command
    options = [] if command == "controlplane" else ["--n-atoms", "20"]
    done = run(installed, tmp_path, command, "demo", "--home", "relhome", *options)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout and "downloaded and verified" in done.stdout, done.stdout[-3000:]
    assert (tmp_path / "relhome" / "controlplane.db").is_file()  # the home is the working directory's relhome
    assert not (ROOT / "relhome").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_stdio_serve_from_the_wheel_answers_initialize_and_tools_list(
        installed: Venv, tmp_path: Path, command: str) -> None:
    params = StdioServerParameters(command=str(installed.bin(command)), args=["serve", "--home", "relhome"],
                                   env=installed.env(), cwd=tmp_path)

    async def session() -> tuple[str, str, set[str]]:
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
                init = await client.initialize()
                listed = await client.list_tools()
                return init.server_info.name, init.server_info.version, {t.name for t in listed.tools}

    name, version, tools = anyio.run(session)
    assert (name, version) == ("mcp-controlplane", __version__)
    assert {"submit_task", "get_task_status", "get_task_result", "lj_relax", "exercise"} <= tools
    assert (tmp_path / "relhome" / "controlplane.db").is_file()
