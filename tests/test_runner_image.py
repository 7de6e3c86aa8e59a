"""The runner's container image cannot be built here (no Docker engine), so this checks what a
build would rely on: every file the Dockerfile copies exists, and those files alone make a
runner that starts, with the entrypoint the Dockerfile names."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

DOCKERFILE = ROOT / "infra" / "runner" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments), with backslash-continued lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        op, _, rest = line.partition(" ")
        out.append((op, " ".join(rest.split())))
    return out


def copies() -> list[tuple[Path, str]]:
    found = []
    for op, rest in instructions():
        if op == "COPY":
            *sources, dest = shlex.split(rest)
            found += [(ROOT / src, dest) for src in sources]
    return found


def test_every_copied_path_exists() -> None:
    assert copies(), "the Dockerfile copies nothing"
    for src, _dest in copies():
        assert src.exists(), f"{src.relative_to(ROOT)} is copied by the Dockerfile but does not exist"


def test_entrypoint_is_the_runner() -> None:
    [entry] = [json.loads(rest) for op, rest in instructions() if op == "ENTRYPOINT"]
    assert entry == ["python", "-m", "infra.runner", "--"]
    [env] = [rest for op, rest in instructions() if op == "ENV" and "PYTHONPATH" in rest] or [""]
    assert "PYTHONPATH=/opt/controlplane" in env


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
    probe = ("import infra.runner.runner as r, controlplane.objectstore.base as b;"
             "print(r.__file__); print(b.__file__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=home, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(home)) for line in out.stdout.split()), out.stdout
    # the entrypoint starts and explains itself
    helped = subprocess.run([sys.executable, "-m", "infra.runner", "--help"], cwd=home, capture_output=True,
                            text=True, timeout=30)
    assert helped.returncode == 0 and "tool command" in helped.stdout
