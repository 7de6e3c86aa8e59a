"""`controlplane catalog export` and `controlplane catalog check`, run as an operator runs them:
the export is what the Terraform modules read (one job per tool with the catalog's image, cpu and
memory), and the check compares a catalog with `terraform output -json` of a deployment and
names every difference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controlplane.catalog import Catalog
from tests.conftest import ROOT

DEFAULT = ROOT / "controlplane" / "default_catalog.toml"
IMAGE = "registry.example/controlplane-tools:0.1.0"


def controlplane(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def export(catalog: Path = DEFAULT, *extra: str) -> dict[str, Any]:
    done = controlplane("catalog", "export", str(catalog), "--default-image", IMAGE, *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def outputs(jobs: dict[str, dict[str, Any]]) -> str:
    """`terraform output -json` of an example root module, whose `jobs` output is the module's."""
    return json.dumps({
        "mcp_url": {"sensitive": False, "type": "string", "value": "https://mcp.example.com/mcp"},
        "jobs": {"sensitive": False, "type": ["object", {}], "value": jobs},
    })


def deployed(exported: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The `jobs` output a faithful apply of the export would give (the modules' shape)."""
    return {tool: {"name": f"cp-{tool}", "id": f"arn:aws:batch:eu-west-1:1:job-definition/cp-{tool}:1",
                   "image": job["image"], "cpu": job["cpu"], "memory_mb": job["memory_mb"]}
            for tool, job in exported["jobs"].items()}


def test_export_gives_every_tool_one_job_with_its_image_cpu_and_memory() -> None:
    catalog = Catalog.load(DEFAULT)
    exported = export()
    assert exported["format"] == 1
    assert set(exported["jobs"]) == set(catalog.tools) == {"lj_relax", "exercise"}
    for name, tool in catalog.tools.items():
        rc = catalog.resource_classes[tool.resource_class]
        job = exported["jobs"][name]
        assert (job["image"], job["cpu"], job["memory_mb"], job["gpu"]) == (IMAGE, rc.cpu, rc.memory_mb, rc.gpu)
        assert job["max_runtime_s"] == tool.max_runtime_s and job["resource_class"] == rc.name
    # the catalog the server is given is the same catalog, each tool's image filled in
    served = Catalog.from_data(exported["catalog"], source="export")
    assert {n: t.image for n, t in served.tools.items()} == {"lj_relax": IMAGE, "exercise": IMAGE}
    assert served.tools["lj_relax"].input_schema == catalog.tools["lj_relax"].input_schema


def test_export_keeps_a_tools_own_image_and_writes_yaml_too(tmp_path: Path) -> None:
    text = DEFAULT.read_text().replace('command = ["{python}", "-m", "controlplane_tools.exercise"]',
                                       'command = ["{python}", "-m", "controlplane_tools.exercise"]\nimage = "own:2"')
    (tmp_path / "c.toml").write_text(text)
    as_yaml = controlplane("catalog", "export", str(tmp_path / "c.toml"), "--default-image", IMAGE, "--format", "yaml")
    import yaml

    jobs = yaml.safe_load(as_yaml.stdout)["jobs"]
    assert (jobs["exercise"]["image"], jobs["lj_relax"]["image"]) == ("own:2", IMAGE)


def test_export_refuses_a_tool_without_an_image_naming_it(tmp_path: Path) -> None:
    done = controlplane("catalog", "export", str(DEFAULT))
    assert done.returncode == 2 and not done.stdout
    assert "tools.exercise.image" in done.stderr and "--default-image" in done.stderr
    assert "Traceback" not in done.stderr


def test_export_refuses_an_invalid_catalog_as_the_server_would(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(DEFAULT.read_text().replace('resource_class = "cpu_small"', 'resource_class = "gpu"', 1))
    done = controlplane("catalog", "export", str(tmp_path / "bad.toml"), "--default-image", IMAGE)
    assert done.returncode == 2 and "resource_class: unknown resource class 'gpu'" in done.stderr


def test_check_passes_a_deployment_that_matches(tmp_path: Path) -> None:
    (tmp_path / "out.json").write_text(outputs(deployed(export())))
    done = controlplane("catalog", "check", str(DEFAULT), str(tmp_path / "out.json"), "--default-image", IMAGE)
    assert done.returncode == 0, done.stderr
    # `terraform output -json jobs` (the value alone) on stdin works the same; numbers may be strings
    jobs = deployed(export())
    jobs["exercise"]["memory_mb"] = str(jobs["exercise"]["memory_mb"])
    done = controlplane("catalog", "check", str(DEFAULT), "-", "--default-image", IMAGE, stdin=json.dumps(jobs))
    assert done.returncode == 0, done.stderr


def test_check_names_every_difference_and_fails() -> None:
    jobs = deployed(export())
    jobs["lj_relax"]["image"] = "old:1"
    jobs["exercise"]["cpu"] = 2
    jobs["exercise"]["memory_mb"] = 512
    jobs["retired"] = {"name": "cp-retired", "id": "cp-retired", "image": IMAGE, "cpu": 1, "memory_mb": 2048}
    done = controlplane("catalog", "check", str(DEFAULT), "-", "--default-image", IMAGE, stdin=outputs(jobs))
    assert done.returncode == 1
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("mismatch:")]
    assert len(lines) == 4, done.stderr
    assert any("'lj_relax': image is 'registry.example/controlplane-tools:0.1.0' in the catalog but 'old:1'" in ln
               for ln in lines)
    assert any("'exercise': cpu is 1" in ln and "but 2" in ln for ln in lines)
    assert any("'exercise': memory_mb is 2048" in ln and "but 512" in ln for ln in lines)
    assert any("'retired'" in ln and "no such tool in the catalog" in ln for ln in lines)


def test_check_names_a_tool_without_a_job() -> None:
    jobs = deployed(export())
    del jobs["exercise"]
    done = controlplane("catalog", "check", str(DEFAULT), "-", "--default-image", IMAGE, stdin=outputs(jobs))
    assert done.returncode == 1 and "tool 'exercise': no job in the deployment" in done.stderr


@pytest.mark.parametrize("text", ["not json", "[1, 2]", json.dumps({"mcp_url": {"value": "x"}})])
def test_check_refuses_what_is_not_a_deployments_outputs(text: str) -> None:
    done = controlplane("catalog", "check", str(DEFAULT), "-", "--default-image", IMAGE, stdin=text)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "not JSON" in done.stderr or "no `jobs` map" in done.stderr


def test_check_of_a_missing_outputs_file_is_an_error(tmp_path: Path) -> None:
    done = controlplane("catalog", "check", str(DEFAULT), str(tmp_path / "nope.json"), "--default-image", IMAGE)
    assert done.returncode == 2 and "cannot read the outputs" in done.stderr


def test_a_server_given_a_bad_catalog_in_its_environment_says_where_and_exits(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http", "--port", "0"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "CONTROLPLANE_HOME": str(tmp_path),
                               "CONTROLPLANE_CATALOG_JSON": json.dumps({"tools": {}, "resource_classes": {}})})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    said = " ".join(done.stderr.split())  # the console wraps long lines
    assert "CONTROLPLANE_CATALOG_JSON: resource_classes: at least one resource class is required" in said


MANY_ERRORS = """\
[resource_classes.small]
max_concurrency = 0
cpu = 1

[resource_classes.fine]
cpu = 1

[tools.alpha]
description = "two problems in one tool"
resource_class = "fine"
command = ["{python}", "-m", "alpha"]
colour = "red"
estimate_s = "fast"
input_schema = { type = "object", properties = { n = { type = "integr" } } }

[tools.beta]
description = "an unknown resource class"
resource_class = "gpu_huge"
command = ["{python}", "-m", "beta"]
input_schema = { type = "object" }

[tools.gamma]
description = "options its provider does not take"
resource_class = "fine"
command = ["{python}", "-m", "gamma"]
provider_options = { queue = "q" }
input_schema = { type = "object" }
"""
MANY_PROBLEMS = [
    "resource_classes.small.max_concurrency: ", "tools.alpha.colour: unknown field", "tools.alpha.estimate_s: ",
    "tools.alpha.input_schema: not a valid JSON Schema", "tools.beta.resource_class: unknown resource class 'gpu_huge'",
    "tools.gamma.provider_options.queue: unknown field",
]


def test_validate_lists_every_problem_with_its_tool_and_field(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(MANY_ERRORS)
    done = controlplane("catalog", "validate", str(path))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    for problem in MANY_PROBLEMS:
        assert [line for line in lines if line.startswith(f"error: {path}: {problem}")], (problem, done.stderr)
    assert lines[-1] == f"{len(MANY_PROBLEMS)} problems in {path}"
    assert "more)" not in done.stderr and "Traceback" not in done.stderr

    good = controlplane("catalog", "validate", str(DEFAULT))
    assert good.returncode == 0 and "valid (2 tools, 2 resource classes)" in good.stderr


def test_a_server_refuses_a_bad_catalog_listing_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(MANY_ERRORS)
    done = subprocess.run([sys.executable, "-m", "controlplane.cli", "serve", "--transport", "http", "--port", "0"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "CONTROLPLANE_HOME": str(tmp_path / "home"), "COLUMNS": "400",
                               "CONTROLPLANE_CATALOG_PATH": str(path)})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    for problem in MANY_PROBLEMS:
        assert f"{path}: {problem}" in done.stderr, (problem, done.stderr)


def test_export_warns_of_a_command_naming_a_path_on_this_machine(tmp_path: Path) -> None:
    """The export still succeeds: the warning is on stderr, the catalog on stdout."""
    script = tmp_path / "relax.py"
    script.write_text("print('hi')\n")
    text = DEFAULT.read_text()
    text = text.replace('command = ["{python}", "-m", "controlplane_tools.lj_relax"]',
                        f'command = ["{{python}}", "{script}", "--config={ROOT}/conf.toml"]', 1)
    assert str(script) in text
    (tmp_path / "catalog.toml").write_text(text)
    done = controlplane("catalog", "export", str(tmp_path / "catalog.toml"), "--default-image", IMAGE)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"].keys() == {"lj_relax", "exercise"}
    said = done.stderr.splitlines()
    for path in (str(script), f"{ROOT}/conf.toml"):
        assert [line for line in said if line.startswith("warning: ") and "tools.lj_relax.command: " in line
                and f"'{path}' is a path on this machine" in line], done.stderr
    assert "exercise" not in done.stderr  # {python} -m module is fine

    clean = controlplane("catalog", "export", str(DEFAULT), "--default-image", IMAGE)
    assert clean.returncode == 0 and "warning" not in clean.stderr
