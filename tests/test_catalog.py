"""The tool catalog: the default one loads, a bad one is refused with a message that names the
file, the tool and the field, YAML works as well as TOML, and a catalog tool's input schema is
what decides whether a call is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.catalog import Catalog, CatalogError, default_catalog_text, ensure_catalog
from controlplane.settings import Settings
from tests.conftest import Agent

GOOD = """\
[resource_classes.small]
max_concurrency = 1
cpu = 1
memory_mb = 512

[tools.relax]
description = "Relax something"
resource_class = "small"
command = ["{python}", "-m", "relax"]
default_runtime_s = 60
max_runtime_s = 600
size_feature = "n"
{extra}

[tools.relax.input_schema]
type = "object"
additionalProperties = false
properties.n = { type = "integer", minimum = 1 }
{schema_extra}
"""


def write(tmp_path: Path, extra: str = "", schema_extra: str = "", name: str = "catalog.toml") -> Path:
    path = tmp_path / name
    path.write_text(GOOD.replace("{extra}", extra).replace("{schema_extra}", schema_extra))
    return path


def load_error(path: Path) -> str:
    with pytest.raises(CatalogError) as e:
        Catalog.load(path)
    return str(e.value)


def test_default_catalog_loads() -> None:
    cat = Catalog.parse(default_catalog_text(), source="default_catalog.toml")
    assert set(cat.tools) == {"lj_relax", "exercise"}
    assert set(cat.resource_classes) == {"cpu_small", "cpu_standard"}
    lj = cat.tool("lj_relax")
    assert lj.resource_class == "cpu_small" and lj.size_feature == "n_atoms"
    assert lj.default_runtime_s <= lj.max_runtime_s
    assert lj.input_schema["additionalProperties"] is False
    assert lj.input_size({"n_atoms": 38}) == 38.0


def test_first_use_writes_the_default_catalog_into_home(settings: Settings) -> None:
    path = settings.resolved_catalog_path
    assert not path.exists()
    cat = ensure_catalog(path)
    assert path.read_text() == default_catalog_text()
    assert set(cat.tools) == {"lj_relax", "exercise"}
    # An operator's edits are kept: the file is not rewritten once it exists.
    path.write_text(path.read_text().replace("max_concurrency = 2", "max_concurrency = 7", 1))
    assert ensure_catalog(path).resource_classes["cpu_small"].max_concurrency == 7


def test_a_valid_custom_catalog_loads(tmp_path: Path) -> None:
    cat = Catalog.load(write(tmp_path))
    assert cat.source == str(tmp_path / "catalog.toml")
    assert cat.tool("relax").max_runtime_s == 600
    assert cat.resource_classes["small"].memory_mb == 512


@pytest.mark.parametrize(
    ("extra", "schema_extra", "field", "problem"),
    [
        pytest.param('colour = "red"', "", "tools.relax.colour", "unknown field", id="unknown-field"),
        pytest.param('estimate_s = "fast"', "", "tools.relax.estimate_s", "valid number", id="bad-type"),
        pytest.param('retry = { max_attempts = 2, retry_on = ["bad_luck"] }', "", "tools.relax.retry.retry_on",
                     "bad_luck", id="unknown-retry-kind"),
        pytest.param("", 'properties.m = { type = "integr" }', "tools.relax.input_schema",
                     "not a valid JSON Schema", id="invalid-json-schema"),
        pytest.param("", 'required = "n"', "tools.relax.input_schema", "not a valid JSON Schema",
                     id="invalid-json-schema-required"),
    ],
)
def test_bad_field_is_named_with_file_tool_and_field(tmp_path: Path, extra: str, schema_extra: str, field: str,
                                                     problem: str) -> None:
    path = write(tmp_path, extra, schema_extra)
    msg = load_error(path)
    assert msg.startswith(f"{path}: {field}: "), msg
    assert problem in msg


def test_additional_properties_true_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace("additionalProperties = false", "additionalProperties = true"))
    msg = load_error(path)
    assert msg.startswith(f"{path}: tools.relax.input_schema: "), msg
    assert "additionalProperties must be false" in msg


def test_additional_properties_defaults_to_false_when_omitted(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace("additionalProperties = false\n", ""))
    spec = Catalog.load(path).tool("relax")
    assert spec.input_schema["additionalProperties"] is False
    assert not spec.validator().is_valid({"n": 1, "surprise": True})


def test_unknown_resource_class_is_named(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace('resource_class = "small"', 'resource_class = "gpu_huge"'))
    msg = load_error(path)
    assert msg.startswith(f"{path}: tools.relax.resource_class: "), msg
    assert "gpu_huge" in msg and "small" in msg  # what was asked for and what exists


def test_reserved_tool_name_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace("tools.relax", "tools.submit_task"))
    msg = load_error(path)
    assert msg.startswith(f"{path}: tools.submit_task.name: "), msg
    assert "canonical tool" in msg


@pytest.mark.parametrize(
    ("old", "new", "field", "problem"),
    [
        pytest.param("default_runtime_s = 60", "default_runtime_s = 900", "default_runtime_s",
                     "900 exceeds max_runtime_s (600)", id="default-runtime-above-max"),
        pytest.param('size_feature = "n"', 'size_feature = "atoms"', "size_feature",
                     "'atoms' is not an input property", id="size-feature-not-a-property"),
    ],
)
def test_cross_field_errors_name_file_tool_and_field(tmp_path: Path, old: str, new: str, field: str,
                                                      problem: str) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace(old, new))
    msg = load_error(path)
    assert msg == f"{path}: tools.relax.{field}: {problem}"


def test_bad_resource_class_field_is_named(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace("max_concurrency = 1", "max_concurrency = 0"))
    msg = load_error(path)
    assert msg.startswith(f"{path}: resource_classes.small.max_concurrency: "), msg


def test_a_resource_class_name_the_store_cannot_keep_is_refused(tmp_path: Path) -> None:
    """Its name is stored with every task of the class: at most 64 printable characters."""
    long = "c" * 65
    path = write(tmp_path)
    path.write_text(path.read_text().replace("[resource_classes.small]", f"[resource_classes.{long}]")
                    .replace('resource_class = "small"', f'resource_class = "{long}"'))
    assert load_error(path).startswith(f"{path}: resource_classes.{long}.name: ")


def test_unreadable_and_unparsable_files_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert load_error(missing).startswith(f"{missing}: cannot read catalog")
    broken = tmp_path / "broken.toml"
    broken.write_text("[tools.relax\n")
    assert load_error(broken).startswith(f"{broken}: not valid TOML")
    broken_yaml = tmp_path / "broken.yaml"
    broken_yaml.write_text("tools: [unclosed\n")
    assert load_error(broken_yaml).startswith(f"{broken_yaml}: not valid YAML")


def test_yaml_catalog_loads_like_toml(tmp_path: Path) -> None:
    from_toml = Catalog.load(write(tmp_path))
    as_yaml = tmp_path / "catalog.yaml"
    as_yaml.write_text(yaml.safe_dump({
        "resource_classes": {"small": {"max_concurrency": 1, "cpu": 1, "memory_mb": 512}},
        "tools": {"relax": {
            "description": "Relax something", "resource_class": "small", "command": ["{python}", "-m", "relax"],
            "default_runtime_s": 60, "max_runtime_s": 600, "size_feature": "n",
            "input_schema": {"type": "object", "additionalProperties": False,
                             "properties": {"n": {"type": "integer", "minimum": 1}}},
        }},
    }))
    from_yaml = Catalog.load(as_yaml)
    assert from_yaml.tools == from_toml.tools
    assert from_yaml.resource_classes == from_toml.resource_classes

    yml = tmp_path / "catalog.yml"
    yml.write_text(as_yaml.read_text().replace("max_runtime_s: 600", "max_runtime_s: 600\n    colour: red"))
    msg = load_error(yml)
    assert msg.startswith(f"{yml}: tools.relax.colour: unknown field"), msg


@pytest.mark.anyio
async def test_catalog_tool_call_with_bad_inputs_names_the_field(agent: Agent, cp) -> None:
    too_small = await agent.error("lj_relax", n_atoms=1)
    assert too_small["code"] == "INVALID_REQUEST"
    assert too_small["message"].startswith("inputs.n_atoms: ")
    wrong_type = await agent.error("lj_relax", n_atoms="13")
    assert wrong_type["code"] == "INVALID_REQUEST" and wrong_type["message"].startswith("inputs.n_atoms: ")
    unknown = await agent.error("lj_relax", n_atoms=13, colour="red")
    assert unknown["code"] == "INVALID_REQUEST" and "'colour'" in unknown["message"]
    via_submit = await agent.error("submit_task", tool_name="lj_relax", inputs={"fmax": -1})
    assert via_submit["code"] == "INVALID_REQUEST" and via_submit["message"].startswith("inputs.fmax: ")
    assert cp.store.tasks.count_by_state() == {}  # nothing was submitted


def test_tool_ttl_above_the_server_max_is_refused_at_start(tmp_path: Path) -> None:
    from controlplane.app import ControlPlane

    path = write(tmp_path)
    path.write_text(path.read_text().replace('resource_class = "small"', 'resource_class = "small"\nttl_s = 999999'))
    with pytest.raises(CatalogError) as e:
        ControlPlane(Settings(home=tmp_path / "home", catalog_path=path, max_ttl_s=3600))
    assert str(e.value) == f"{path}: tools.relax.ttl_s: 999999 exceeds the server's max_ttl_s (3600)"


SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["n"],
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 100},
        "x": {"type": "number", "exclusiveMaximum": 1.5},
        "name": {"type": "string", "pattern": r"^\w{1,8}$", "format": "email"},
        "mode": {"enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "uniqueItems": True},
        "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}}, "additionalProperties": False},
    },
}
INPUTS = [
    {"n": 1}, {"n": 100, "x": 1.4, "name": "ab_c", "mode": "fast", "tags": ["a", "b"], "opts": {"deep": True}},
    {"n": 2.0}, {"n": 0}, {"n": 101}, {"n": "1"}, {"n": True}, {}, {"n": 1, "extra": 1}, {"n": 1, "x": 1.5},
    {"n": 1, "name": "not an email but fine"}, {"n": 1, "name": "ab-c"}, {"n": 1, "name": "٣٣"},  # Arabic-Indic digits: \w in Python
    {"n": 1, "mode": "medium"}, {"n": 1, "tags": ["a", "a"]}, {"n": 1, "tags": ["a", "b", "c"]}, {"n": 1, "tags": [1]},
    {"n": 1, "opts": {"deep": 1}}, {"n": 1, "opts": {"deeper": True}}, {"n": 10**30}, {"n": 1, "x": 10**30},
    {"n": 0, "mode": "x", "tags": [1, 1]},
]


@pytest.mark.parametrize("inputs", INPUTS, ids=[str(i) for i in range(len(INPUTS))])
def test_input_check_refuses_what_the_reference_refuses_in_its_words(inputs: dict) -> None:
    """The compiled check answers valid inputs; every refusal, and its wording, is jsonschema's
    own (formats are annotations only, as in the reference)."""
    from jsonschema import Draft202012Validator

    from controlplane.catalog import InputValidator

    checked = InputValidator(SCHEMA)
    assert checked.fast is not None
    reference = sorted(Draft202012Validator(SCHEMA).iter_errors(inputs), key=lambda e: [str(p) for p in e.path])
    assert [(list(e.path), e.message) for e in checked.errors(inputs)] == [(list(e.path), e.message) for e in reference]


def test_a_pattern_only_python_reads_is_checked_by_the_reference() -> None:
    """`a{,3}` is a regular expression to Python, not to ECMA-262: the tool still works."""
    from controlplane.catalog import InputValidator

    checked = InputValidator({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{,3}$"}}})
    assert checked.fast is None
    assert checked.is_valid({"s": "aa"})
    assert [e.message for e in checked.errors({"s": "aaaa"})] == ["'aaaa' does not match '^a{,3}$'"]


def test_a_reload_keeps_what_it_replaced_for_the_tasks_admitted_before(tmp_path: Path) -> None:
    """`adopt` swaps the contents whole; a task launches with the tool and class current at its
    submit (`admitted`), and a removed class is still scheduled (`queues`)."""
    import time

    cat = Catalog.load(write(tmp_path))
    before = time.time() - 1
    edited = GOOD.replace("{extra}", "").replace("{schema_extra}", "").replace('"-m", "relax"', '"-m", "relax2"')
    edited = edited.replace("[resource_classes.small]", "[resource_classes.big]").replace('"small"', '"big"')
    new = Catalog.parse(edited, source="new.toml")
    held = cat.tools
    cat.adopt(new)
    after = time.time() + 1
    assert cat.source == "new.toml" and set(cat.resource_classes) == {"big"} and held is not cat.tools
    old = cat.admitted("relax", "small", before)
    assert old.tool.command[-1] == "relax" and old.resource_class.name == "small"
    assert cat.admitted("relax", "big", after).tool.command[-1] == "relax2"
    assert [rc.name for rc in cat.queues()] == ["big", "small"]
    with pytest.raises(LookupError):
        cat.admitted("nope", "big", before)
