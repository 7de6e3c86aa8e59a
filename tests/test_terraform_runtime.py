"""What the modules' outputs and settings do when used as documented, beyond what a schema checks:
each is rendered from the module's own text (python-hcl2 cannot evaluate HCL, so the few
interpolations are filled with sample values) and then used the way the deploy guide says.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from tests.test_terraform import TERRAFORM, blocks, deployed_resources, exported, jobs_module, parsed, resources  # noqa: F401 - a fixture

SAMPLES = {  # an interpolation's text -> what Terraform would put there
    r'join(",", var.private_subnet_ids)': "subnet-0a1,subnet-0b2",
}


def rendered_output(cloud: str, name: str) -> str:
    """A module output that is a string (or join(" ", [strings])), its interpolations filled."""
    value = blocks(TERRAFORM / "modules" / cloud, "output")[name]["value"]
    for expression, sample in SAMPLES.items():
        value = value.replace(f"${{{expression}}}", sample)
    joined = re.fullmatch(r'\$\{join\(" ", \[(.*)\]\)\}', value, re.S)
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', joined.group(1)) if joined else [value.strip('"')]
    text = " ".join(p for p in parts if p != " ")

    def fill(m: re.Match[str]) -> str:
        return "x-" + re.sub(r"\W+", "-", m.group(1)).strip("-")[-20:]
    return re.sub(r"\$\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", fill, text)


@pytest.mark.parametrize("cloud", ["aws", "azure", "gcp"])
def test_migrate_command_reaches_its_cli_as_written_when_run_as_documented(cloud: str) -> None:
    """`$(terraform output -raw migrate_command)`: the shell splits the words and keeps any quotes,
    so an argument quoted in the output reaches the CLI with its quotes (the AWS CLI refused the
    --network-configuration shorthand so)."""
    command = rendered_output(cloud, "migrate_command")
    argv = subprocess.run(["bash", "-c", 'printf "%s\\n" $1', "_", command], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    assert not [a for a in argv if "'" in a or '"' in a], argv
    if cloud == "aws":
        value = argv[argv.index("--network-configuration") + 1]
        assert value == ("awsvpcConfiguration={subnets=[subnet-0a1,subnet-0b2],"
                         f"securityGroups=[{value.split('securityGroups=[')[1].split(']')[0]}],assignPublicIp=DISABLED}}")


def oauth_attributes() -> set[str]:
    """The attributes of the settings module's `oauth` object type."""
    text = (TERRAFORM / "modules" / "settings" / "variables.tf").read_text()
    body = text.split('variable "oauth"', 1)[1].split("\n}\n", 1)[0]
    return set(re.findall(r"^\s{4}(\w+)\s+=", body, re.M))


def test_every_oauth_setting_a_deployment_needs_has_an_attribute_and_reaches_the_server() -> None:
    """Cognito and Entra ID name scopes otherwise than tasks:*, so the scope names (and the
    authorization servers, the algorithm) must be settable; each attribute lands on a setting
    the server has, and the cloud modules refuse any other (an object type drops it silently)."""
    from controlplane.settings import Settings

    attributes = oauth_attributes()
    assert {"scopes", "authorization_servers", "algorithm"} <= attributes
    main = (TERRAFORM / "modules" / "settings" / "main.tf").read_text()
    fields = set(Settings.model_fields)
    for env in re.findall(r"CONTROLPLANE_(AUTH_\w+?)\b(?!\$)", main):
        assert env.lower() in fields, env
    assert '"CONTROLPLANE_AUTH_SCOPE_${upper(role)}"' in main
    for role in ("submit", "read", "cancel", "admin"):
        assert f"auth_scope_{role}" in fields and re.search(rf"\b{role} = optional\(string\)",
                                                            (TERRAFORM / "modules" / "settings" / "variables.tf").read_text())
    for attribute in attributes - {"scopes"}:
        assert f"var.oauth.{attribute}" in main, attribute
    for cloud in ("aws", "gcp", "azure"):
        text = (TERRAFORM / "modules" / cloud / "variables.tf").read_text()
        listed = set(re.findall(r'"(\w+)"', text.split('variable "oauth"', 1)[1].split("\n}\n", 1)[0]))
        assert listed == attributes, f"{cloud}: the oauth attributes it admits differ from the settings module's"


def test_azure_job_role_stops_one_execution_and_its_name_is_unique_per_resource_group() -> None:
    """providers/container_apps cancels with Jobs_StopExecution, which Azure authorizes as
    Microsoft.App/jobs/stop/execution/action; jobs/stop/action (stop all) is not needed."""
    provider = (TERRAFORM.parent / "providers" / "container_apps.py").read_text()
    assert "begin_stop_execution" in provider and "begin_stop_multiple_executions" not in provider
    [role] = [body for rtype, name, body in resources(TERRAFORM / "modules" / "azure")
              if rtype == "azurerm_role_definition" and name == "job_runner"]
    actions = [a.strip('"') for a in role["permissions"][0]["actions"]]
    assert "Microsoft.App/jobs/stop/execution/action" in actions and "Microsoft.App/jobs/stop/action" not in actions
    # role names are unique per tenant: the name carries a digest of the resource group's id
    assert re.search(r"sha256\((azurerm_resource_group\.this|local\.resource_group)\.id\)", role["name"]), role["name"]


def test_azure_apps_wait_for_the_role_assignments_they_use() -> None:
    """Key Vault references and AcrPull work minutes after the assignment: each app or job that
    reads a secret at creation depends on a wait that follows its assignments."""
    found = {(rtype, name): body for rtype, name, body in resources(TERRAFORM / "modules" / "azure")}
    wait = found[("time_sleep", "rbac_propagation")]
    assert "azurerm_role_assignment.server_secrets" in wait["triggers"]["secrets"]
    assert "azurerm_role_assignment.migrate_secret" in wait["triggers"]["secrets"]
    assert "azurerm_role_assignment.acr_pull" in wait["triggers"]["pulls"]
    for app in (("azurerm_container_app", "server"), ("azurerm_container_app_job", "migrate")):
        assert found[app]["depends_on"] == ["${time_sleep.rbac_propagation}"], app
    for secret in ("database_url", "secret_key"):
        assert found[("azurerm_key_vault_secret", secret)]["depends_on"] == ["${time_sleep.deployer_rbac}"]


def test_azure_database_subnet_admits_postgres_between_its_own_servers() -> None:
    """Zone-redundant HA (on by default) replicates inside the database subnet; the NSG's
    deny-VNet rule would cut it unless an allow of 5432 within the subnet comes first."""
    [nsg] = [body for rtype, name, body in resources(TERRAFORM / "modules" / "azure")
             if rtype == "azurerm_network_security_group" and name == "db"]
    rules = sorted(({k: str(v).strip('"') for k, v in r.items()} for r in nsg["security_rule"]), key=lambda r: int(r["priority"]))
    db = "${azurerm_subnet.db.address_prefixes[0]}"
    first = next(r for r in rules if r["source_address_prefix"] in (db, "VirtualNetwork"))
    assert first["access"] == "Allow" and first["source_address_prefix"] == db and first["destination_port_range"] == "5432"


def hcl_string(value: str) -> str:
    """A quoted HCL string literal as the program sees it (python-hcl2 keeps the escapes)."""
    return value.strip('"').replace("\\\\", "\\")


def test_aws_pulls_from_the_ecr_repositories_its_images_name() -> None:
    """The example passes no ecr_repository_arns although its images are ECR URIs: the module
    reads each image's repository from its URI and grants pulls from it."""
    [local] = [b for tf in (TERRAFORM / "modules" / "aws").glob("iam.tf") for b in parsed(tf)["locals"]]
    pattern = re.compile(hcl_string(local["ecr_uri"]))
    m = pattern.search("123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/controlplane-tools:0.1.0")
    assert m and m.groups() == ("123456789012", "eu-west-1", "team/controlplane-tools")
    assert pattern.search("123456789012.dkr.ecr.eu-west-1.amazonaws.com/cp@sha256:ab").group(3) == "cp"  # type: ignore[union-attr]
    assert not pattern.search("ghcr.io/acme/controlplane:1")
    assert "var.control_plane_image" in local["ecr_image_repos"] and "module.settings.jobs" in local["ecr_image_repos"]
    docs = [body for tf in (TERRAFORM / "modules" / "aws").glob("iam.tf") for block in parsed(tf)["data"]
            for rtype, named in block.items() for name, body in named.items() if name.strip('"') == "ecr_pull"]
    assert "local.ecr_repository_arns" in json.dumps(docs)


def test_aws_grants_and_trusts_no_more_than_it_uses() -> None:
    text = (TERRAFORM / "modules" / "aws" / "iam.tf").read_text()
    provider = (TERRAFORM.parent / "providers" / "aws_batch.py").read_text()
    assert "filter_log_events" not in provider and '"logs:FilterLogEvents"' not in text
    monitoring = text.split('data "aws_iam_policy_document" "rds_monitoring_assume"', 1)[1].split("\n}\n", 1)[0]
    assert '"aws:SourceAccount"' in monitoring  # the confused-deputy guard the ECS roles' trust has
    main = (TERRAFORM / "modules" / "aws" / "main.tf").read_text()
    assert "data.aws_region.current.name" not in main  # deprecated in hashicorp/aws 6.x: .region


@pytest.mark.parametrize("directory", ["modules/aws", "modules/gcp", "modules/azure", "examples/aws",
                                       "examples/gcp", "examples/azure", "examples/gcp-with-aws-jobs"])
def test_names_the_clouds_refuse_are_refused_at_plan(directory: str) -> None:
    """RDS identifiers, Key Vault and Container Apps names take no trailing hyphen and no two in
    a row; the `name` validation refuses them before anything is made."""
    [variable] = [b['"name"'] for tf in (TERRAFORM / directory).glob("variables.tf")
                  for b in parsed(tf)["variable"] if '"name"' in b]
    condition = variable["validation"][0]["condition"]
    m = re.fullmatch(r'\$\{can\(regex\("(.*)", var\.name\)\) && length\(var\.name\) <= (\d+)\}', condition)
    assert m, condition
    pattern, longest = re.compile(hcl_string(m.group(1))), int(m.group(2))

    def accepted(name: str) -> bool:
        return bool(pattern.search(name)) and len(name) <= longest
    assert accepted("controlplane") and accepted("cp-1") and accepted("a-b-c")
    assert not accepted("cp-") and not accepted("cp--x") and not accepted("-cp") and not accepted("1cp")
    assert not accepted("c") and not accepted("Cp") and not accepted("x" * (longest + 1))


def test_gcp_waits_for_its_apis_in_a_fresh_project() -> None:
    """Service accounts, custom roles and the project lookup fail in a fresh project until the
    APIs are on; each waits for them, and the Cloud Resource Manager API (the lookup's) is one."""
    directory = TERRAFORM / "modules" / "gcp"
    [apis] = [body for rtype, name, body in resources(directory) if rtype == "google_project_service"]
    assert "cloudresourcemanager.googleapis.com" in apis["for_each"]
    waits = "${google_project_service.apis}"
    for module in (directory, jobs_module("gcp")):  # each waits for the APIs its own module turns on
        for rtype, name, body in resources(module):
            if rtype in ("google_service_account", "google_project_iam_custom_role", "google_storage_bucket",
                         "google_sql_database_instance", "google_compute_global_address"):
                assert waits in body.get("depends_on", []), f"{module.name}: {rtype}.{name} does not wait for the APIs"
    # ...and the jobs module, told to leave the APIs to the full module, waits for the full module's,
    # which include every one it would turn on itself
    call = blocks(directory, "module")["jobs"]
    assert call["enable_apis"] is False and call["depends_on"] == [waits]
    [own] = [body for rtype, name, body in resources(jobs_module("gcp")) if rtype == "google_project_service"]
    assert "var.enable_apis ?" in own["for_each"]
    assert set(re.findall(r'"([\w.]+\.googleapis\.com)"', own["for_each"])) <= set(re.findall(r'"([\w.]+\.googleapis\.com)"', apis["for_each"]))
    [project] = [b['"google_project"']['"this"'] for tf in directory.glob("*.tf") for b in parsed(tf).get("data", [])
                 if '"google_project"' in b]
    assert project["depends_on"] == [waits]


def test_gcp_example_can_reuse_a_networks_private_service_access() -> None:
    [module] = [b['"controlplane"'] for b in parsed(TERRAFORM / "examples" / "gcp" / "main.tf")["module"]]
    assert module["create_private_service_access"] == "${var.create_private_service_access}"


def test_gcp_runs_jobs_with_run_permissions_only() -> None:
    """The job role holds exactly the permissions of the Cloud Run calls the provider makes (each
    method's IAM permission, from Cloud Run's REST reference), and the server does not act as the
    jobs' account: jobs.run with overrides is authorized by run.jobs.run and
    run.jobs.runWithOverrides on the job."""
    calls = {"get_job": {"run.jobs.get"}, "run_job": {"run.jobs.run", "run.jobs.runWithOverrides"},
             "get_execution": {"run.executions.get"}, "list_executions": {"run.executions.list"},
             "cancel_execution": {"run.executions.cancel"}}
    provider = (TERRAFORM.parent / "providers" / "cloud_run.py").read_text()
    made = set().union(*(perms for call, perms in calls.items() if re.search(rf"\.(?:jobs|executions)\.{call}\b", provider)))
    assert "run.jobs.run" in made
    for module, tf in (("gcp", "iam.tf"), ("gcp-jobs", "main.tf")):
        text = (TERRAFORM / "modules" / module / tf).read_text()
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        [block] = re.findall(r'resource "google_project_iam_custom_role" "job_runner" \{(.*?)\n\}', code, re.S)
        granted = set(re.findall(r'"(run\.[\w.]+)"', block))
        assert granted == made, f"{module}: grants {sorted(granted - made)} unused, lacks {sorted(made - granted)}"
        assert "roles/iam.serviceAccountUser" not in code


def test_gcp_refuses_what_cloud_run_would_at_plan(exported: dict[str, Any]) -> None:
    """Job names over 63 characters or taking the migration job's name, and a catalog over Cloud
    Run's 32,768 characters for one env value, are refused by preconditions; the default catalog
    fits with room to spare."""
    found = {(rtype, name): body for rtype, name, body in deployed_resources("gcp")}
    job_pre = found[("google_cloud_run_v2_job", "tool")]["lifecycle"][0]["precondition"][0]
    assert "<= 63" in job_pre["condition"]
    migrate = '${!contains(values(module.settings.job_names), "${var.name}-migrate")}'  # no tool's job takes its name
    assert [p["condition"] for p in found[("google_cloud_run_v2_job", "migrate")]["lifecycle"][0]["precondition"]] == [migrate]
    [svc_pre] = found[("google_cloud_run_v2_service", "server")]["lifecycle"][0]["precondition"]
    assert svc_pre["condition"] == "${length(local.server_env.CONTROLPLANE_CATALOG_JSON) <= 32768}"
    assert len(json.dumps(exported["catalog"], separators=(",", ":"))) < 32768 // 2
    az_pre = [b for rtype, name, b in resources(TERRAFORM / "modules" / "azure")
              if (rtype, name) == ("azurerm_container_app_job", "migrate")][0]["lifecycle"][0]["precondition"]
    assert [p["condition"] for p in az_pre] == [migrate]


# ---- job shapes: what each cloud accepts, refused at plan otherwise ------------------------------
def shape_table(cloud: str, name: str) -> dict[str, list[int]]:
    """A locals table of vCPU -> memory, its range(a, b, c) entries expanded as Terraform does."""
    [table] = [b[name] for tf in jobs_module(cloud).glob("main.tf") for b in parsed(tf)["locals"] if name in b]
    out = {}
    for cpu, value in table.items():
        m = re.fullmatch(r"\$\{range\((\d+), (\d+), (\d+)\)\}", str(value))
        out[cpu.strip('"')] = list(range(*map(int, m.groups()))) if m else [int(v) for v in value]
    return out


def tf_cpu(cpu: float) -> str:
    return f"{cpu:g}"  # tostring(1) = "1", tostring(0.25) = "0.25"


SHAPE_CONDITIONS = {  # the precondition each job resource has, and what it means
    "aws": ("${each.value.gpu == 0 && contains(try(local.fargate_memory_mb[tostring(each.value.cpu)], []), "
            "each.value.memory_mb)}",
            lambda job: job["gpu"] == 0 and job["memory_mb"] in shape_table("aws", "fargate_memory_mb").get(tf_cpu(job["cpu"]), [])),
    "gcp": ("${each.value.gpu == 0 && each.value.memory_mb >= try(local.cloud_run_memory_mb[tostring(each.value.cpu)][0], "
            "1000000000) && each.value.memory_mb <= try(local.cloud_run_memory_mb[tostring(each.value.cpu)][1], 0)}",
            lambda job: job["gpu"] == 0 and tf_cpu(job["cpu"]) in shape_table("gcp", "cloud_run_memory_mb")
            and shape_table("gcp", "cloud_run_memory_mb")[tf_cpu(job["cpu"])][0] <= job["memory_mb"]
            <= shape_table("gcp", "cloud_run_memory_mb")[tf_cpu(job["cpu"])][1]),
    "azure": ("${each.value.gpu == 0 && each.value.cpu >= 0.25 && each.value.cpu <= 4 && floor(each.value.cpu * 4) == "
              "each.value.cpu * 4 && each.value.memory_mb == each.value.cpu * 2048}",
              lambda job: job["gpu"] == 0 and 0.25 <= job["cpu"] <= 4 and float(job["cpu"] * 4).is_integer()
              and job["memory_mb"] == job["cpu"] * 2048),
}
# (cpu, memory_mb, gpu) -> accepted?, from each cloud's documentation
SHAPES = {
    "aws": {(1, 2048, 0): True, (0.25, 512, 0): True, (4, 30720, 0): True, (16, 122880, 0): True,
            (1, 1024, 0): False, (0.25, 1536, 0): False, (3, 6144, 0): False, (8, 18432, 0): False, (1, 2048, 1): False},
    "gcp": {(1, 2048, 0): True, (2, 8192, 0): True, (8, 32768, 0): True, (4, 2048, 0): True,
            (1, 8192, 0): False, (4, 1024, 0): False, (3, 4096, 0): False, (0.5, 512, 0): False, (1, 2048, 1): False},
    "azure": {(1, 2048, 0): True, (0.25, 512, 0): True, (4, 8192, 0): True, (1.75, 3584, 0): True,
              (1, 4096, 0): False, (0.3, 614, 0): False, (8, 16384, 0): False, (1, 2048, 1): False},
}


@pytest.mark.parametrize("cloud", sorted(SHAPE_CONDITIONS))
def test_each_job_shape_is_one_the_cloud_runs_and_gpus_are_refused_at_plan(cloud: str, exported: dict[str, Any]) -> None:
    """A resource class whose cpu/memory the cloud would refuse (or whose GPU it would drop, or
    the server refuse) fails the plan naming the tool; the default catalog's classes pass."""
    condition, means = SHAPE_CONDITIONS[cloud]
    [job] = [body for rtype, name, body in deployed_resources(cloud) if name == "tool"
             and rtype in ("aws_batch_job_definition", "google_cloud_run_v2_job", "azurerm_container_app_job")]
    assert condition in [p["condition"] for p in job["lifecycle"][0]["precondition"]]
    for (cpu, memory_mb, gpu), accepted in SHAPES[cloud].items():
        assert means({"cpu": cpu, "memory_mb": memory_mb, "gpu": gpu}) is accepted, (cloud, cpu, memory_mb, gpu)
    for tool, spec in exported["jobs"].items():
        assert means(spec), f"{cloud}: the default catalog's {tool} would be refused"


def test_azure_tool_jobs_have_no_network_path_to_the_database() -> None:
    """Tool code is not vetted: on AWS and Google the jobs' network reaches no database. On Azure
    the database NSG admits the apps' subnet, so the tool jobs run in an environment outside the
    VNet; the server and the migration stay in the VNet-integrated one."""
    found = {(rtype, name): body for rtype, name, body in deployed_resources("azure")}
    jobs_env = found[("azurerm_container_app_job", "tool")]["container_app_environment_id"]
    env_name = re.fullmatch(r"\$\{azurerm_container_app_environment\.(\w+)\.id\}", jobs_env)
    assert env_name, jobs_env
    assert "infrastructure_subnet_id" not in found[("azurerm_container_app_environment", env_name.group(1))]
    for app in (("azurerm_container_app", "server"), ("azurerm_container_app_job", "migrate")):
        env = found[app]["container_app_environment_id"]
        assert env != jobs_env and "infrastructure_subnet_id" in found[("azurerm_container_app_environment", env.split(".")[1])]
