"""The runner's container image cannot be built here (no Docker engine), so this checks what a
build would rely on: every file the Dockerfile copies exists, and those files alone make a
runner that starts, with the entrypoint the Dockerfile names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests import dockerfile
from tests.conftest import ROOT

DOCKERFILE = ROOT / "infra" / "runner" / "Dockerfile"


def copies() -> list[tuple[Path, str]]:
    return dockerfile.copies(DOCKERFILE, ROOT)


def test_every_copied_path_exists() -> None:
    assert copies(), "the Dockerfile copies nothing"
    for src, _dest in copies():
        assert src.exists(), f"{src.relative_to(ROOT)} is copied by the Dockerfile but does not exist"


def test_entrypoint_is_the_runner() -> None:
    assert dockerfile.exec_form(DOCKERFILE, "ENTRYPOINT") == ["python", "-m", "controlplane_runner", "--"]
    assert dockerfile.env(DOCKERFILE)["PYTHONPATH"] == "/opt/controlplane"


def test_the_copied_files_alone_make_a_working_runner(tmp_path: Path) -> None:
    """Lay the copied files out as the image would and start the runner from them."""
    image = tmp_path / "image"
    for src, dest in copies():
        target = image / dest.lstrip("/")
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, target)
    home = image / "opt" / "controlplane"
    probe = ("import controlplane_runner.runner as r, controlplane.objectstore.base as b;"
             "print(r.__file__); print(b.__file__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=home, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(home)) for line in out.stdout.split()), out.stdout
    # the entrypoint starts and explains itself
    helped = subprocess.run([sys.executable, "-m", "controlplane_runner", "--help"], cwd=home, capture_output=True,
                            text=True, timeout=30)
    assert helped.returncode == 0 and "tool command" in helped.stdout
