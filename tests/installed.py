"""The artifacts users install, made once per test session: the sdist and the wheel as
`python -m build` makes them, and the wheel installed non-editable into fresh venvs outside the
checkout (tests/conftest.py's `built` and `installed` fixtures; tests/test_install.py and
tests/test_image_run.py use them).

The build is isolated, as PyPI's publishing and `pip install .` build: its backend comes from
PyPI at pyproject.toml's build-system requires, never from this venv. The installs skip byte
compilation (pip's --no-compile): an image or a pipx venv compiles on import as well, and the
install costs half as long.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "mcp-controlplane"
# The image's user (infra/controlplane/Dockerfile's USER), which the image-run test runs as.
IMAGE_UID = 10001


@dataclass(frozen=True)
class Built:
    """The sdist and the wheel of this checkout."""

    wheel: Path
    sdist: Path
    seconds: float


@dataclass(frozen=True)
class Venv:
    """A venv holding the wheel, installed as a user installs it."""

    root: Path
    seconds: float

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user with this venv's commands first on PATH: nothing of the
        checkout (no PYTHONPATH, no CONTROLPLANE_* of the shell, no other venv)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("CONTROLPLANE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env


@contextmanager
def outside_the_checkout(prefix: str) -> Iterator[Path]:
    """A new directory under the system's temporary directory, others may read and enter it (an
    unprivileged user runs what is installed there; pytest's own tmp_path is its owner's alone)."""
    path = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    assert not path.is_relative_to(ROOT)
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build(outdir: Path) -> Built:
    """`python -m build` of the checkout into outdir: the sdist, then the wheel from the sdist."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    [wheel] = outdir.glob("*.whl")
    [sdist] = outdir.glob("*.tar.gz")
    return Built(wheel, sdist, time.monotonic() - started)


def interpreter(uid: int | None = None) -> str:
    """A Python >= 3.11 for a fresh venv: this one's base interpreter, or where `uid` cannot run
    it (its installation under a private home), the system's python3."""
    candidates = [str(Path(sys.base_prefix) / "bin" / "python3"), shutil.which("python3", path="/usr/local/bin:/usr/bin")]
    for python in filter(None, candidates):
        user = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        try:
            done = subprocess.run([python, "-c", "import sys, venv; assert sys.version_info >= (3, 11)"],
                                  capture_output=True, timeout=60, cwd="/", **user)
        except OSError:
            continue
        if done.returncode == 0:
            return python
    raise AssertionError(f"no Python >= 3.11 that uid {uid} can run among {candidates}")


def install(wheel: Path, root: Path, extras: str = "", python: str | None = None) -> Venv:
    """A fresh venv at root with the wheel (and its extras) installed non-editable by pip."""
    started = time.monotonic()
    subprocess.run([python or interpreter(), "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    requirement = f"{DISTRIBUTION}{f'[{extras}]' if extras else ''} @ {wheel.as_uri()}"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
                           "--quiet", "--disable-pip-version-check", "--no-compile", requirement],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return Venv(root, time.monotonic() - started)
