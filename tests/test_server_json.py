"""server.json, the entry the MCP registry publishes: valid against the registry's published
schema (tests/schemas/), at the package's version, naming the PyPI package with its stdio
transport and the CONTROLPLANE_* settings a user sets (each a real setting, the secret ones
marked), and claimed by the README's `mcp-name:` line, which the registry looks for on PyPI."""

from __future__ import annotations

import json

import jsonschema

from controlplane import __version__
from controlplane.settings import Settings
from tests.conftest import ROOT

SCHEMA = json.loads((ROOT / "tests" / "schemas" / "server.schema.json").read_text())
SERVER = json.loads((ROOT / "server.json").read_text())
# What a value of these may hold: a password, a signing key, bearer tokens.
SECRETS = {"CONTROLPLANE_DATABASE_URL", "CONTROLPLANE_SECRET_KEY", "CONTROLPLANE_AUTH_TOKENS"}


def test_server_json_is_valid_against_the_registrys_published_schema() -> None:
    assert SERVER["$schema"] == SCHEMA["$id"]
    jsonschema.validate(SERVER, SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def test_it_is_this_version_of_the_pypi_package_over_stdio() -> None:
    assert SERVER["version"] == __version__
    [package] = SERVER["packages"]
    assert (package["registryType"], package["identifier"], package["version"]) == ("pypi", "mcp-controlplane", __version__)
    assert package["transport"] == {"type": "stdio"}
    assert [a["value"] for a in package["packageArguments"]] == ["serve"]  # uvx mcp-controlplane serve


def test_its_environment_variables_are_real_settings_described_and_the_secret_ones_marked() -> None:
    [package] = SERVER["packages"]
    variables = {v["name"]: v for v in package["environmentVariables"]}
    settings = {f"CONTROLPLANE_{name.upper()}" for name in Settings.model_fields} | {"CONTROLPLANE_SECRET_KEY"}
    assert sorted(set(variables) - settings) == []
    assert {"CONTROLPLANE_HOME", "CONTROLPLANE_DATABASE_URL", "CONTROLPLANE_SECRET_KEY"} <= set(variables)
    assert all(v.get("description") for v in variables.values())
    assert {name for name, v in variables.items() if v.get("isSecret")} == SECRETS & set(variables)


def test_the_readme_claims_the_server_for_the_registry() -> None:
    line = f"mcp-name: {SERVER['name']}"
    assert line in (ROOT / "README.md").read_text(), f"README.md lacks the line {line!r} (the registry's PyPI check)"
