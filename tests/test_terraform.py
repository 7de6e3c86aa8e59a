"""Static checks of terraform/ (no terraform binary can be installed here, so nothing is planned
or applied): every .tf file parses (python-hcl2); within each module and example every variable
used is declared, every declared one is used or documented, and each has a description; every
module input an example (or module) passes exists in the called module, and its required inputs
are all given; checkov finds no failed check, and every skip says why.

The catalog test renders controlplane/default_catalog.toml, converted by the CLI, through each
cloud module's job resource. python-hcl2 parses HCL but cannot evaluate it, so the test reads
the one job resource of each module (the only resource whose for_each is the settings module's
`jobs`, itself the export's `jobs` map keyed by tool: one job per tool by construction), and
evaluates the few expressions it writes for image, cpu and memory with `render` below, which
knows exactly those forms (each.value.X, tostring(...), "${...}Mi", format("%gGi", ... / 1024)) and
refuses any other. What it proves: each tool's job gets the catalog's image, cpu and memory in
the unit the cloud takes, and the module's `jobs` output reads them back in the shape
`controlplane catalog check` compares. What it cannot: that the providers accept the resources
(`terraform validate` / `plan`), or what Terraform's own type conversions do at apply time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import hcl2
import pytest

from controlplane.catalog import Catalog
from tests.conftest import ROOT

TERRAFORM = ROOT / "terraform"
MODULES = sorted(p for p in (TERRAFORM / "modules").iterdir() if p.is_dir())
EXAMPLES = sorted(p for p in (TERRAFORM / "examples").iterdir() if p.is_dir())
CLOUDS = {"aws": "aws_batch_job_definition", "gcp": "google_cloud_run_v2_job", "azure": "azurerm_container_app_job"}
META_ARGS = {"source", "version", "providers", "depends_on", "count", "for_each"}
IMAGE = "registry.example/controlplane-tools:0.1.0"


def unquote(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] == '"' else s


@cache
def parsed(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return hcl2.load(f)  # type: ignore[no-any-return]


def blocks(directory: Path, kind: str) -> dict[str, dict[str, Any]]:
    """name -> body of every `kind` block (variable, output, module, locals...) in a directory."""
    out: dict[str, dict[str, Any]] = {}
    for tf in sorted(directory.glob("*.tf")):
        for block in parsed(tf).get(kind, []):
            for name, body in block.items():
                out[unquote(name)] = body
    return out


def resources(directory: Path) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for tf in sorted(directory.glob("*.tf")):
        for block in parsed(tf).get("resource", []):
            for rtype, named in block.items():
                for name, body in named.items():
                    found.append((unquote(rtype), unquote(name), body))
    return found


def jobs_module(cloud: str) -> Path:
    """The jobs-only module a cloud's full module calls for its jobs (its `module "jobs"`)."""
    full = TERRAFORM / "modules" / cloud
    return (full / unquote(blocks(full, "module")["jobs"]["source"])).resolve()


def deployed_resources(cloud: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The resources a cloud's full module makes: its own and its jobs module's."""
    return resources(TERRAFORM / "modules" / cloud) + resources(jobs_module(cloud))


def output_value(directory: Path, name: str) -> tuple[Path, str]:
    """An output's value expression, followed through `${module.X.Y}` to the module that makes it."""
    value = blocks(directory, "output")[name]["value"]
    m = re.fullmatch(r"\$\{module\.(\w+)\.(\w+)\}", value) if isinstance(value, str) else None
    if m is None:
        return directory, value
    called = (directory / unquote(blocks(directory, "module")[m.group(1)]["source"])).resolve()
    return output_value(called, m.group(2))


def code(directory: Path) -> str:
    """The directory's .tf text without comment lines."""
    return "\n".join(ln for tf in sorted(directory.glob("*.tf")) for ln in tf.read_text().splitlines()
                     if not ln.lstrip().startswith(("#", "//")))


def readme(directory: Path) -> str:
    own = directory / "README.md"
    return own.read_text() if own.exists() else (TERRAFORM / "README.md").read_text()


def test_every_tf_file_parses() -> None:
    files = sorted(TERRAFORM.rglob("*.tf"))
    assert len(files) >= 20
    for tf in files:
        assert isinstance(parsed(tf), dict), tf


@pytest.mark.parametrize("directory", MODULES + EXAMPLES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_variables_are_declared_used_and_described(directory: Path) -> None:
    declared = blocks(directory, "variable")
    used = set(re.findall(r"\bvar\.([A-Za-z_][A-Za-z0-9_-]*)", code(directory)))
    assert used <= set(declared), f"used but not declared: {sorted(used - set(declared))}"
    docs = readme(directory)
    unused = [v for v in declared if v not in used and f"`{v}`" not in docs]
    assert not unused, f"declared, never used nor documented: {unused}"
    for name, body in declared.items():
        assert len(unquote(body.get("description", ""))) > 10, f"variable {name} has no description"


@pytest.mark.parametrize("directory", MODULES + EXAMPLES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_module_inputs_exist_in_the_module_and_required_ones_are_given(directory: Path) -> None:
    for name, body in blocks(directory, "module").items():
        source = (directory / unquote(body["source"])).resolve()
        assert source.is_dir() and TERRAFORM in source.parents, f"module {name}: source {body['source']}"
        wanted = blocks(source, "variable")
        given = set(body) - META_ARGS - {"__is_block__", "__comments__", "__inline_comments__"}
        assert given <= set(wanted), f"module {name} is given inputs {sorted(given - set(wanted))} it does not have"
        required = {v for v, spec in wanted.items() if "default" not in spec}
        assert required <= given, f"module {name} is not given its required inputs {sorted(required - given)}"


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_each_full_module_makes_its_jobs_with_its_jobs_module_and_passes_its_variables_through(cloud: str) -> None:
    """modules/<cloud> calls modules/<cloud>-jobs for the jobs, makes no job (nor anything per
    catalog tool) itself, and gives the jobs module each variable the two share by name as it was
    given it."""
    full = TERRAFORM / "modules" / cloud
    assert jobs_module(cloud) == TERRAFORM / "modules" / f"{cloud}-jobs"
    mine = [(rtype, name) for rtype, name, body in resources(full) if "module.settings.jobs" in str(body.get("for_each"))]
    assert not mine and not any(rtype == CLOUDS[cloud] and name == "tool" for rtype, name, _b in resources(full)), mine
    call = blocks(full, "module")["jobs"]
    shared = set(blocks(full, "variable")) & set(blocks(jobs_module(cloud), "variable"))
    assert {"name", "catalog"} <= shared
    for variable in shared:
        assert call.get(variable) == f"${{var.{variable}}}", f"{cloud}: module jobs is not given var.{variable}"


ADDRESSES = ROOT / "tests" / "terraform_addresses.txt"


def moved_blocks(directory: Path) -> dict[str, str]:
    """from -> to of every `moved` block in a module."""
    return {unquote(b["from"]).strip("${}"): unquote(b["to"]).strip("${}")
            for tf in sorted(directory.glob("*.tf")) for b in parsed(tf).get("moved", [])}


def declares(directory: Path, address: str) -> bool:
    """Whether a module declares the resource an address names (`module.X.` followed into module
    X's source; an instance key, `[0]` or `["k"]`, needs the resource's count or for_each)."""
    m = re.fullmatch(r"module\.(\w+)\.(.+)", address)
    if m:
        calls = blocks(directory, "module")
        return m.group(1) in calls and declares((directory / unquote(calls[m.group(1)]["source"])).resolve(), m.group(2))
    m = re.fullmatch(r"(\w+)\.(\w+)(\[.+\])?", address)
    assert m, f"cannot read the address {address!r}"
    found = [body for rtype, name, body in resources(directory) if (rtype, name) == m.group(1, 2)]
    if not found or m.group(3) is None:
        return bool(found)
    return ("count" if m.group(3)[1:-1].isdigit() else "for_each") in found[0]


@pytest.mark.parametrize("directory", MODULES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_every_address_a_deployment_holds_is_declared_or_moved_where_it_is(directory: Path) -> None:
    """A resource a module no longer declares would be destroyed, and made again under its new
    address, unless a `moved` block says where it went: each address tests/terraform_addresses.txt
    lists is declared where it was, or moved to an address its module (or a module it calls)
    declares. Every resource the module declares is listed, so the list stays whole."""
    listed = {line.split()[1] for line in ADDRESSES.read_text().splitlines()
              if line.strip() and not line.startswith("#") and line.split()[0] == directory.name}
    moved = moved_blocks(directory)
    declared = {f"{rtype}.{name}" for rtype, name, _b in resources(directory)}
    assert declared <= listed, f"not in {ADDRESSES.name}: {sorted(declared - listed)}"
    for address in sorted(listed):
        if address in moved:
            assert declares(directory, moved[address]), f"{address} is moved to {moved[address]}, which nothing declares"
        else:
            assert address in declared, f"{address} is gone from {directory.name} with no moved block"
    for source, target in moved.items():
        assert declares(directory, target), f"moved {source} -> {target}: nothing declares {target}"
        assert source not in declared or target.startswith(f"{source}["), f"moved {source}: still declared here"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_output_the_mcp_url_and_the_oauth_settings(example: Path) -> None:
    outputs = blocks(example, "output")
    assert {"mcp_url", "oauth", "jobs", "migrate_command"} <= set(outputs)
    for name, body in outputs.items():
        if name.endswith("_jobs"):  # another cloud's jobs (a jobs-only module's), for `catalog check`
            assert re.fullmatch(r"\$\{module\.\w+\.jobs\}", unquote(body["value"])), body["value"]
        else:
            assert unquote(body["value"]) == f"${{module.controlplane.{name}}}"
        assert unquote(body.get("description", "")), f"output {name} has no description"
    for name, body in blocks(example, "variable").items():
        if "default" not in body:
            assert body.get("validation"), f"{example.name}: required variable {name} is not validated"


# ---- checkov ------------------------------------------------------------------------------------
def checkov_binary() -> str | None:
    """checkov pins old versions of libraries the project uses (packaging, boto3), so .ci/run
    installs it in a venv of its own, .ci/checkov; CHECKOV names another one."""
    for candidate in (os.environ.get("CHECKOV"), str(ROOT / ".ci" / "checkov" / "bin" / "checkov"),
                      shutil.which("checkov")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def checkov() -> dict[str, Any]:
    """One checkov run over terraform/ and the Dockerfiles, shared by the tests below."""
    binary = checkov_binary()
    if binary is None:
        if os.environ.get("CONTROLPLANE_REQUIRE_CHECKOV") == "1":
            pytest.fail("checkov is required (CONTROLPLANE_REQUIRE_CHECKOV=1) but not installed in .ci/checkov")
        pytest.skip("checkov is not installed (.ci/run installs it in .ci/checkov)")
    done = subprocess.run([binary, "-d", str(TERRAFORM), "-d", str(ROOT / "infra"), "--framework", "terraform",
                           "dockerfile", "--output", "json", "--skip-download", "--compact"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "LOG_LEVEL": "ERROR"})
    # one JSON document per directory scanned, each a report or a list of them (one per framework)
    reports: list[dict[str, Any]] = []
    decoder, text, at = json.JSONDecoder(), done.stdout, 0
    while text[at:].strip():
        doc, end = decoder.raw_decode(text, text.index(text[at:].lstrip()[0], at))
        reports += doc if isinstance(doc, list) else [doc]
        at = end
    merged: dict[str, Any] = {}
    for r in reports:
        into = merged.setdefault(r["check_type"], {"results": {"failed_checks": [], "skipped_checks": []},
                                                   "summary": {"passed": 0, "failed": 0, "parsing_errors": 0}})
        for key in ("failed_checks", "skipped_checks"):
            into["results"][key] += r["results"].get(key, [])
        for key in ("passed", "failed", "parsing_errors"):
            into["summary"][key] += r["summary"][key]
    return merged


def test_checkov_finds_no_failed_check(checkov: dict[str, Any]) -> None:
    assert set(checkov) == {"terraform", "dockerfile"}
    for kind, report in checkov.items():
        failed = [f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range'][0]}): {c['check_name']}"
                  for c in report["results"]["failed_checks"]]
        assert not failed, f"{kind}: " + "\n".join(failed)
        assert report["summary"]["parsing_errors"] == 0
    assert checkov["terraform"]["summary"]["passed"] > 200  # the modules were really scanned


def test_every_checkov_skip_is_justified_inline(checkov: dict[str, Any]) -> None:
    skipped = checkov["terraform"]["results"]["skipped_checks"]
    assert skipped
    for c in skipped:
        reason = c["check_result"].get("suppress_comment", "")
        assert len(reason.strip()) >= 20, f"{c['check_id']} on {c['resource']}: no reason"
    pattern = re.compile(r"#\s*checkov:skip=(CKV2?_[A-Z]+_\d+):(.*)$")
    for tf in TERRAFORM.rglob("*.tf"):
        for line in tf.read_text().splitlines():
            if "checkov:skip" in line:
                m = pattern.search(line)
                assert m and len(m.group(2).strip()) >= 20, f"{tf}: {line.strip()}"


# ---- the catalog drives the jobs ----------------------------------------------------------------
@pytest.fixture(scope="module")
def exported() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "controlplane.cli", "catalog", "export",
                           str(ROOT / "controlplane" / "default_catalog.toml"), "--default-image", IMAGE],
                          capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def render(expression: str, job: dict[str, Any]) -> str:
    """Evaluate one attribute expression of a job resource for one job (each.value = job), for the
    forms the modules use; anything else is refused, so a changed module fails here first."""
    expr = unquote(expression)
    forms: list[tuple[str, Any]] = [
        (r"\$\{each\.value\.(\w+)\}", lambda v: tf_string(v)),
        (r"\$\{tostring\(each\.value\.(\w+)\)\}", lambda v: tf_string(v)),
        (r"\$\{each\.value\.(\w+)\}Mi", lambda v: f"{tf_string(v)}Mi"),
        (r'\$\{format\("%gGi", each\.value\.(\w+) / 1024\)\}', lambda v: f"{v / 1024:g}Gi"),
    ]
    for pattern, fn in forms:
        m = re.fullmatch(pattern, expr)
        if m:
            return str(fn(job[m.group(1)]))
    raise AssertionError(f"render() does not know the expression {expression!r}")


def tf_string(v: Any) -> str:
    """A JSON value as Terraform's tostring/interpolation writes it (1.0 -> "1")."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def job_resource(cloud: str) -> tuple[str, dict[str, Any]]:
    """The one resource of the module made per catalog tool."""
    per_tool = [(rtype, body) for rtype, _name, body in deployed_resources(cloud)
                if body.get("for_each") == "${module.settings.jobs}"]
    assert len(per_tool) == 1, f"{cloud}: {len(per_tool)} resources are made per catalog tool"
    assert per_tool[0][0] == CLOUDS[cloud]
    assert per_tool[0][1]["name"] == "${module.settings.job_names[each.key]}"
    return per_tool[0]


def image_cpu_memory(cloud: str, body: dict[str, Any]) -> tuple[str, str, str]:
    """The job resource's expressions for (image, cpu, memory)."""
    if cloud == "aws":
        props = body["container_properties"]
        image = re.search(r"\bimage = (each\.value\.\w+)", props)
        vcpu = re.search(r'type = "VCPU", value = (tostring\(each\.value\.\w+\))', props)
        memory = re.search(r'type = "MEMORY", value = (tostring\(each\.value\.\w+\))', props)
        assert image and vcpu and memory, props
        return f"${{{image.group(1)}}}", f"${{{vcpu.group(1)}}}", f"${{{memory.group(1)}}}"
    if cloud == "gcp":
        [container] = body["template"][0]["template"][0]["containers"]
        limits = container["resources"][0]["limits"]
        return container["image"], limits["cpu"], limits["memory"]
    [container] = body["template"][0]["container"]
    return container["image"], container["cpu"], container["memory"]


def memory_mb(cloud: str, rendered: str) -> float:
    """A rendered memory limit in MiB, read as the module's `jobs` output reads it back."""
    if cloud == "aws":
        return float(rendered)
    if cloud == "gcp":
        return float(rendered.removesuffix("Mi"))
    return float(rendered.removesuffix("Gi")) * 1024


def test_the_settings_module_reads_the_export(exported: dict[str, Any]) -> None:
    local = {k: v for block in parsed(TERRAFORM / "modules" / "settings" / "main.tf")["locals"] for k, v in block.items()}
    assert local["exported"] == "${try(jsondecode(var.catalog), yamldecode(var.catalog))}"
    assert local["jobs"] == "${local.exported.jobs}"
    assert exported["format"] == 1 and set(exported["jobs"]) == {"lj_relax", "exercise"}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_every_catalog_tool_gets_one_job_with_its_image_cpu_and_memory(cloud: str, exported: dict[str, Any]) -> None:
    catalog = Catalog.load(ROOT / "controlplane" / "default_catalog.toml")
    _rtype, body = job_resource(cloud)
    image_expr, cpu_expr, memory_expr = image_cpu_memory(cloud, body)
    jobs = {tool: {"image": render(image_expr, job), "cpu": render(cpu_expr, job), "memory": render(memory_expr, job)}
            for tool, job in exported["jobs"].items()}  # for_each over the tool-keyed map
    assert set(jobs) == set(catalog.tools)
    for tool, job in jobs.items():
        rc = catalog.resource_classes[catalog.tools[tool].resource_class]
        assert job["image"] == IMAGE
        assert float(job["cpu"]) == rc.cpu
        assert memory_mb(cloud, job["memory"]) == rc.memory_mb
    names = {tool: f"controlplane-{tool.lower().replace('_', '-')}" for tool in jobs}
    assert len(set(names.values())) == len(names)


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_the_jobs_output_has_what_catalog_check_compares(cloud: str) -> None:
    _where, value = output_value(TERRAFORM / "modules" / cloud, "jobs")
    assert value.startswith("${{for tool, ") and f" in {CLOUDS[cloud]}.tool : tool => " in value
    for key in ("name", "id", "image", "cpu", "memory_mb"):
        assert re.search(rf"[{{,] ?{key} = ", value), f"{cloud}: the jobs output has no {key}"


PROVIDER_OPTIONS = {  # what each cloud module passes the settings module for a tool (see main.tf)
    "aws": ("aws_batch", lambda job: {"job_queue": "controlplane", "log_group": "/aws/batch/controlplane",
                                      "job_definition": f"arn:aws:batch:eu-west-1:123456789012:job-definition/{job}:3"}),
    "gcp": ("cloud_run", lambda job: {"job": f"projects/p-1/locations/europe-west1/jobs/{job}"}),
    "azure": ("container_apps", lambda job: {"job": f"/subscriptions/00000000-0000-0000-0000-000000000000/"
                                                    f"resourceGroups/cp/providers/Microsoft.App/jobs/{job}"}),
}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_the_catalog_the_server_is_given_loads_on_that_clouds_provider(cloud: str, exported: dict[str, Any]) -> None:
    """The settings module's server_catalog, written out in Python (a mirror of its HCL, which is
    checked to still be the one mirrored): the server accepts it with each cloud's provider and
    the options naming the jobs, the Container Apps shape check included."""
    local = parsed(TERRAFORM / "modules" / "settings" / "main.tf")["locals"][0]
    text = local["server_catalog"]
    assert "provider = var.provider_name" in local["own_placement"] and "merge(rc, {provider_options = {}})" in text
    assert "jsonencode(merge(spec, local.own_placement[tool]))" in text  # a tool without more_placements
    provider, options = PROVIDER_OPTIONS[cloud]
    assert re.search(rf'provider_name\s+= "{provider}"', (TERRAFORM / "modules" / cloud / "main.tf").read_text())
    data = json.loads(json.dumps(exported["catalog"]))
    for rc in data["resource_classes"].values():
        rc["provider_options"] = {}
    for tool, spec in data["tools"].items():
        spec["provider"] = provider
        spec["provider_options"] = options(f"controlplane-{tool.replace('_', '-')}")
    catalog = Catalog.from_data(data, source=f"{cloud} server catalog")
    assert {t.provider for t in catalog.tools.values()} == {provider}


def test_a_tool_with_more_placements_is_given_to_the_server_with_each_in_order(exported: dict[str, Any]) -> None:
    """The settings module's server catalog for a tool with `more_placements` (mirrored, the HCL
    checked to be the one mirrored): its own cloud's placement first, with the patience, then the
    others; the server accepts it, and with grants every placement reaches the one store."""
    from controlplane import reachable

    text = parsed(TERRAFORM / "modules" / "settings" / "main.tf")["locals"][0]["server_catalog"]
    assert "placements = concat([merge(local.own_placement[tool], local.patience)], var.more_placements[tool])" in text
    assert 'if !contains(["provider", "provider_options"], k)' in text
    example = (TERRAFORM / "examples" / "gcp-with-aws-jobs" / "main.tf").read_text()
    assert 'tool => [{ provider = "aws_batch", provider_options = options }]' in example
    data = json.loads(json.dumps(exported["catalog"]))
    for rc in data["resource_classes"].values():
        rc["provider_options"] = {}
    for tool, spec in data["tools"].items():
        spec.pop("provider", None), spec.pop("provider_options", None)
        job = f"controlplane-{tool.replace('_', '-')}"
        spec["placements"] = [{"provider": "cloud_run", "provider_options": PROVIDER_OPTIONS["gcp"][1](job),
                               "patience_s": 600},
                              {"provider": "aws_batch", "provider_options": PROVIDER_OPTIONS["aws"][1](job)}]
    catalog = Catalog.from_data(data, source="two-cloud server catalog")
    for tool in catalog.tools:
        first, second = catalog.placements(tool)
        assert (first.provider, first.patience_s, second.provider) == ("cloud_run", 600, "aws_batch")
    assert reachable.problems(catalog, job_store_access="grants", default_store="gs://b") == []
    assert reachable.problems(catalog, job_store_access="identity", default_store="gs://b")  # Batch would not reach it


def test_the_two_cloud_examples_catalog_check_covers_its_batch_jobs(exported: dict[str, Any], tmp_path: Path) -> None:
    """The two-cloud example outputs the Batch job definitions beside the Cloud Run jobs, the
    definitions (and queue) its server's catalog names are the ones `aws-jobs` makes and outputs,
    and `controlplane catalog check` of the example's outputs finds a Batch job that differs from
    the catalog, naming the output."""
    example = TERRAFORM / "examples" / "gcp-with-aws-jobs"
    assert output_value(example, "jobs")[0] == (TERRAFORM / "modules" / "gcp-jobs").resolve()  # Cloud Run
    where, batch = output_value(example, "batch_jobs")
    assert where == (TERRAFORM / "modules" / "aws-jobs").resolve()
    # the catalog's Batch placement: the queue it makes, and each tool's definition the output lists
    assert "${{for tool, def in aws_batch_job_definition.tool : tool => {" in batch and "id = def.arn" in batch
    local = {k: v for block in parsed(where / "main.tf")["locals"] for k, v in block.items()}
    options = local["provider_options"]
    assert options.startswith("${{for tool, def in aws_batch_job_definition.tool : tool => {")
    assert "job_queue = aws_batch_job_queue.this.name" in options and "job_definition = def.arn" in options
    assert "module.aws_jobs.provider_options" in (example / "main.tf").read_text()

    def job(tool: str, spec: dict[str, Any], at: str) -> dict[str, Any]:
        return {"name": f"controlplane-{tool}", "id": f"{at}/controlplane-{tool}", "image": spec["image"],
                "cpu": spec["cpu"], "memory_mb": spec["memory_mb"]}

    run = {t: job(t, j, "projects/p/locations/us-central1/jobs") for t, j in exported["jobs"].items()}
    batch_jobs = {t: job(t, j, "arn:aws:batch:us-east-1:1:job-definition") for t, j in exported["jobs"].items()}
    batch_jobs["exercise"]["memory_mb"] = 512  # the Batch side applied with an older catalog
    del batch_jobs["lj_relax"]
    out = tmp_path / "outputs.json"
    out.write_text(json.dumps({name: {"sensitive": False, "type": ["object", {}], "value": value}
                               for name, value in (("jobs", run), ("batch_jobs", batch_jobs),
                                                   ("mcp_url", "https://mcp.example.com/mcp"))}))
    done = subprocess.run([sys.executable, "-m", "controlplane.cli", "catalog", "check",
                           str(ROOT / "controlplane" / "default_catalog.toml"), str(out), "--default-image", IMAGE],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert done.returncode == 1, done.stderr
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("mismatch:")]
    assert len(said) == 2, done.stderr
    assert any("batch_jobs: tool 'exercise': memory_mb is 2048 in the catalog but 512 in job "
               "arn:aws:batch:us-east-1:1:job-definition/controlplane-exercise" in ln for ln in said)
    assert any("batch_jobs: tool 'lj_relax': no job in the deployment" in ln for ln in said)


# ---- jobs hold no storage permission ---------------------------------------------------------
JOB_IDENTITY = {"aws": r"aws_iam_role\.job\.", "gcp": r"google_service_account\.jobs\.",
                "azure": r"identity\[0\]\.principal_id|job-"}  # Azure: each job's system-assigned identity
STORAGE_GRANTS = {  # what could give an identity a way into the bucket
    "aws": ("aws_iam_role_policy", "aws_iam_role_policy_attachment", "aws_iam_policy_attachment"),
    "gcp": ("google_storage_bucket_iam_member", "google_storage_bucket_iam_binding", "google_project_iam_member"),
    "azure": ("azurerm_role_assignment",),
}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_job_identities_hold_no_storage_permission_and_jobs_use_grants(cloud: str) -> None:
    """A job reaches only its own attempt's keys, through URLs the control plane signs
    (CONTROLPLANE_JOB_STORE_ACCESS=grants, set for every cloud by the settings module): no policy,
    role or bucket binding names a job identity, except Azure's AcrPull to pull its image. The
    jobs module's own grants (for job_store_access = "identity") are made only when asked for,
    and the full module asks for "grants"."""
    full = TERRAFORM / "modules" / cloud
    assert unquote(blocks(full, "module")["jobs"]["job_store_access"]) == "grants"
    identity_only = re.compile(r'^\$\{var\.job_store_access == "identity" \? ')
    for directory in (full, jobs_module(cloud)):
        for rtype, name, body in resources(directory):
            if rtype not in STORAGE_GRANTS[cloud]:
                continue
            text = json.dumps(body)
            if not re.search(JOB_IDENTITY[cloud], text):
                continue
            if directory != full and identity_only.match(str(body.get("count", body.get("for_each", "")))):
                continue
            assert cloud == "azure" and unquote(body.get("role_definition_name", "")) == "AcrPull", \
                f"{rtype}.{name} grants a job"
    if cloud == "aws":  # the job role has no policy document but the one for "identity"
        docs = {unquote(name) for directory in (full, jobs_module(cloud)) for tf in directory.glob("*.tf")
                for block in parsed(tf).get("data", []) for rtype, named in block.items()
                if unquote(rtype) == "aws_iam_policy_document" for name in named}
        assert "job_execution" in docs and "job" not in docs
    [env] = [body["value"] for name, body in blocks(TERRAFORM / "modules" / "settings", "output").items()
             if name == "environment"]
    assert re.search(r'CONTROLPLANE_JOB_STORE_ACCESS"?\s*[:=]\s*"grants"', json.dumps(env).replace('\\"', '"'))
