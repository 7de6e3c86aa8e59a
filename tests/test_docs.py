"""The documentation: the mkdocs site builds with --strict (no broken link or anchor, no page outside
the nav, no warning), every error code and every setting has its entry, the docs/design/ pages the
code points at exist, the catalogs the docs show are valid, and nothing in the repository refers
to documents outside it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from controlplane.catalog import Catalog
from controlplane.errors import ErrorCode, TaskErrorCode
from controlplane.settings import Settings
from tests.conftest import ROOT

DOCS = ROOT / "docs"
# What the repository is made of (not .venv, build output, or fetched tools).
SOURCES = ("README.md", "mkdocs.yml", "pyproject.toml", ".ci/run", "controlplane", "providers", "infra", "tests",
           "terraform", "bench", "docs")


def repository_files() -> list[Path]:
    """Tracked and new (not ignored) text files under SOURCES."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *SOURCES], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file() and not p.endswith((".pyc", ".png"))]


def nav_pages(nav: list) -> set[str]:
    pages: set[str] = set()
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            pages |= nav_pages(value) if isinstance(value, list) else {value}
    return pages


def mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)  # noqa: S506 - SafeLoader, python tags ignored


def test_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` fails on any warning: a link to a missing page or anchor, a page outside the nav."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]
    assert (tmp_path / "site" / "troubleshooting" / "index.html").is_file()


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    pages = nav_pages(mkdocs_config()["nav"])
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == on_disk


def test_the_design_pages_the_code_points_at_exist() -> None:
    cited: dict[str, set[str]] = {}
    for path in repository_files():
        for page in re.findall(r"docs/design/([\w-]+\.md)", path.read_text(errors="replace")):
            cited.setdefault(page, set()).add(str(path.relative_to(ROOT)))
    assert cited, "the code's comments point at docs/design/ pages"
    missing = {page: sorted(where) for page, where in cited.items() if not (DOCS / "design" / page).is_file()}
    assert not missing
    assert {f"design/{p}" for p in cited} <= nav_pages(mkdocs_config()["nav"])


def test_nothing_refers_to_documents_outside_the_repository() -> None:
    """Design reasoning lives in docs/design/, in the project's words: no numbered outside documents,
    no path out of the checkout."""
    outside = re.compile("|".join([r"\bseeds?[ _-]?0\d\d\b", r"\bseeds/", r"\.\./" + "shared", r"shared/" + "seeds"]),
                         re.IGNORECASE)
    found = []
    for path in repository_files():
        if path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def troubleshooting_entries(section: str) -> set[str]:
    text = (DOCS / "troubleshooting.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^### `([A-Z_]+)`$", body, re.MULTILINE))


def test_every_error_code_has_a_troubleshooting_entry() -> None:
    """A new code in controlplane/errors.py without its entry (meaning, causes, what to do) fails here."""
    assert {str(c) for c in ErrorCode} <= troubleshooting_entries("Call errors")
    assert {str(c) for c in TaskErrorCode} <= troubleshooting_entries("Task errors")
    text = (DOCS / "troubleshooting.md").read_text()
    for entry in re.split(r"^### ", text, flags=re.MULTILINE)[1:]:
        assert "**Means" in entry and "**What to do:**" in entry, entry.splitlines()[0]


def test_every_setting_is_documented() -> None:
    text = (DOCS / "configuration.md").read_text()
    missing = [name for name in Settings.model_fields if f"| `CONTROLPLANE_{name.upper()}` |" not in text]
    assert not missing


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_catalogs_the_docs_show_are_valid(path: Path) -> None:
    for block in re.findall(r"^```toml[^\n]*\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL):
        if "[tools." in block or "\n[tools" in block:
            Catalog.from_data(tomllib.loads(block), source=str(path.relative_to(ROOT)))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc make it (for the headings this repository has)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_links_between_the_repositorys_markdown_files_resolve() -> None:
    """Outside docs/ (which the strict build checks), a relative link names a file that exists, and
    a heading of it when it names an anchor: README.md and terraform's READMEs link into docs/."""
    broken = []
    for path in repository_files():
        if path.suffix != ".md" or DOCS in path.parents:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve()
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
