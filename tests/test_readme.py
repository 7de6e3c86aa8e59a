"""The README opens with the two commands a newcomer runs, and CI runs the same test command."""

from __future__ import annotations

from tests.conftest import ROOT


def readme_commands() -> list[str]:
    return [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines()[:12] if ln.startswith("    ")]


def test_readme_opens_with_demo_and_test_commands() -> None:
    demo, tests = readme_commands()[:2]
    assert demo.startswith("python3 -m venv .venv") and demo.endswith("controlplane demo")
    assert tests.startswith("python3 -m venv .venv") and "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    tests = readme_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in [ln.strip() for ln in ci]


def test_readme_sections_in_a_newcomers_order() -> None:
    """What it is, your first tool, connecting a host, operating, deploying, then reference."""
    headings = [ln[3:].strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("## ")]
    wanted = ["What it is", "Your first tool", "Connect your MCP host", "Operate", "Deploy", "Reference"]
    assert [h for h in headings if h in wanted] == wanted
    assert len((ROOT / "README.md").read_text().splitlines()) < 400, "long reference belongs in docs/"


def test_readme_says_how_installed_names_map_to_folders_and_claims_its_registry_name() -> None:
    raw = (ROOT / "README.md").read_text()
    text = " ".join(raw.split())
    for folder, name in [("providers/", "controlplane_providers"), ("infra/runner/", "controlplane_runner"),
                         ("infra/tools/", "controlplane_tools")]:
        assert f"`{folder}` installs as `{name}`" in text or f"`{folder}` as `{name}`" in text
    assert "pipx install mcp-controlplane" in text and "uvx mcp-controlplane serve" in text
    assert "<!-- mcp-name: io.github.mcp-controlplane/mcp-controlplane -->" in raw.splitlines()[-1]


def layout_paths() -> list[str]:
    """The paths the README's layout table names in its first column: a later name without a folder
    of its own is beside the first one (`controlplane/catalog.py`, `placement.py`)."""
    raw = (ROOT / "README.md").read_text()
    table = raw[raw.index("## Layout"):].split("\n\n")[1]
    named: list[str] = []
    for row in table.splitlines()[2:]:
        cell = row.split("|")[1]
        names = cell.split("`")[1::2]
        folder = names[0].rstrip("/").rpartition("/")[0] + "/"  # the folder the first name is in
        named += [names[0]] + [n if "/" in n.rstrip("/") or n in ("tests/", "bench/") else folder + n
                               for n in names[1:]]
    return named


def test_the_layout_table_matches_the_tree() -> None:
    """Every path the table names exists, and every module and folder of controlplane/ is named."""
    named = layout_paths()
    missing = [p for p in named if not (ROOT / p).exists()]
    assert not missing, f"the layout table names paths that are gone: {missing}"
    top = ROOT / "controlplane"
    wanted = sorted(
        [f"controlplane/{p.name}" for p in top.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        + [f"controlplane/{p.name}/" for p in top.iterdir() if (p / "__init__.py").exists()]
        + ["providers/", "infra/runner/", "terraform/", "tests/", "bench/"])
    unnamed = [p for p in wanted if p not in named and p.rstrip("/") not in named]
    assert not unnamed, f"the layout table does not name: {unnamed}"
