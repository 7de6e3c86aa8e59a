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
