"""The data rule: a placement whose jobs cannot reach their tool's object store by their own
identity is refused at catalog load (by a server and by `controlplane catalog validate`), naming
the placement and the store, unless the placement declares the store reachable or jobs use signed
grants; a local placement reaches any store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.app import ControlPlane
from controlplane.catalog import CatalogError, default_catalog_text
from controlplane.settings import Settings
from tests.conftest import FAST

EXERCISE = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]'
CLOUD_RUN = 'provider = "cloud_run", provider_options = { project = "p", region = "us-central1", job = "j" }'


def catalog(path: Path, placements: str) -> Path:
    text = default_catalog_text()
    assert EXERCISE in text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace(EXERCISE, f"placements = [{placements}]\nresource_class = \"cpu_small\"\n"
                                           'command = ["{python}", "-m", "controlplane_tools.exercise"]'))
    return path


def validate(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", "catalog", "validate", str(path)],
                          capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "250", "PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                               "CONTROLPLANE_HOME": str(path.parent / "home"), **env})


def test_a_placement_that_cannot_reach_the_store_is_refused_naming_it(tmp_path: Path) -> None:
    path = catalog(tmp_path / "catalog.toml", f'{{ provider = "local" }}, {{ {CLOUD_RUN} }}')
    done = validate(path, CONTROLPLANE_OBJECT_STORE_URL="s3://results/runs")
    assert done.returncode == 1
    assert (f"error: {path}: tools.exercise.placements.1: cloud_run jobs cannot reach the tool's object store "
            "s3://results/runs by their own identity (they reach gs://)") in done.stderr
    assert "placements.0" not in done.stderr  # local jobs reach any store the control plane opens

    # the control plane's own directory is named without its path
    home = tmp_path / "home"
    catalog(home / "catalog.toml", f'{{ {CLOUD_RUN} }}')
    settings = Settings(home=home, **FAST)
    with pytest.raises(CatalogError) as e:
        ControlPlane(settings)
    assert "tools.exercise.placements.0: cloud_run jobs cannot reach the tool's object store file:// " in str(e.value)
    assert settings.resolved_object_store_url.removeprefix("file://") not in str(e.value)


@pytest.mark.parametrize("env", [{"CONTROLPLANE_JOB_STORE_ACCESS": "grants"}, {}])
def test_grants_or_a_declared_store_make_it_reachable(tmp_path: Path, env: dict[str, str]) -> None:
    declared = "" if env else ', reachable_stores = ["s3://results"]'
    path = catalog(tmp_path / "catalog.toml", f'{{ {CLOUD_RUN}{declared} }}, {{ provider = "local" }}')
    done = validate(path, CONTROLPLANE_OBJECT_STORE_URL="s3://results/runs", **env)
    assert done.returncode == 0, done.stderr
    # a store under its own cloud's scheme needs nothing declared
    assert validate(path, CONTROLPLANE_OBJECT_STORE_URL="gs://results/runs").returncode == 0
    # a declared store does not cover another bucket whose name starts the same
    if not env:
        other = validate(path, CONTROLPLANE_OBJECT_STORE_URL="s3://results-2/runs")
        assert other.returncode == 1 and "s3://results-2/runs" in other.stderr
