"""The laptop path: a control plane where the user is, its jobs in the cloud, made by a jobs-only
module (terraform/modules/{aws,gcp,azure}-jobs) whose outputs are the settings and the catalog.

Each module's `environment` output names settings the control plane (or its provider) has, and
its `catalog` output is the settings module's (each tool pointed at the job made for it). On AWS
the whole path runs on moto's Batch: what the aws-jobs module makes (the queue, one Fargate job
definition per tool named as the module names them, the log group, the bucket) is made in moto,
the control plane is configured with nothing but the module's outputs (the environment, the
catalog file), and a catalog tool runs to success from a laptop its jobs cannot call back (the
runner reports through the bucket, which the job role may use with job_store_access = identity).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests import aws
from tests.aws import moto  # noqa: F401  (fixture)
from tests.cloud import moto_server  # noqa: F401  (fixture)
from tests.conftest import FAST, ROOT, Agent
from tests.test_terraform import TERRAFORM, blocks, jobs_module, parsed, resources, unquote

JOBS_MODULES = {"aws": ("aws_batch", "CONTROLPLANE_AWS_BATCH_"), "gcp": ("cloud_run", "CONTROLPLANE_GCS_"),
                "azure": ("container_apps", "CONTROLPLANE_CONTAINER_APPS_")}


def module(cloud: str) -> Path:
    return TERRAFORM / "modules" / f"{cloud}-jobs"


def environment_keys(cloud: str) -> set[str]:
    value = blocks(module(cloud), "output")["environment"]["value"]
    return {unquote(k) for k in value if k.strip('"').startswith("CONTROLPLANE_")}


@pytest.mark.parametrize("cloud", sorted(JOBS_MODULES))
def test_each_jobs_module_outputs_settings_the_control_plane_has_and_the_settings_catalog(cloud: str) -> None:
    from controlplane_providers.aws_batch import AwsBatchSettings
    from controlplane_providers.container_apps import ContainerAppsSettings

    provider, _prefix = JOBS_MODULES[cloud]
    known = {f"CONTROLPLANE_{f.upper()}" for f in Settings.model_fields}
    known |= {f"CONTROLPLANE_AWS_BATCH_{f.upper()}" for f in AwsBatchSettings.model_fields}
    known |= {f"CONTROLPLANE_CONTAINER_APPS_{f.upper()}" for f in ContainerAppsSettings.model_fields}
    known |= {"CONTROLPLANE_GCS_SIGNER_EMAIL"}  # read by the GCS store itself (controlplane/objectstore/gcs.py)
    assert "CONTROLPLANE_GCS_SIGNER_EMAIL" in (ROOT / "controlplane" / "objectstore" / "gcs.py").read_text()
    keys = environment_keys(cloud)
    assert {"CONTROLPLANE_OBJECT_STORE_URL", "CONTROLPLANE_JOB_STORE_ACCESS"} <= keys <= known, keys - known
    outputs = blocks(module(cloud), "output")
    assert outputs["catalog"]["value"] == "${module.settings.catalog}"
    [settings] = [b['"settings"'] for tf in module(cloud).glob("*.tf") for b in parsed(tf).get("module", []) if '"settings"' in b]
    assert unquote(settings["provider_name"]) == provider and "oauth" not in settings and "public_url" not in settings
    # one job per tool, the very jobs the full module makes (it calls this module), and the jobs
    # output catalog check reads
    mine = {rtype for rtype, _n, body in resources(module(cloud)) if body.get("for_each") == "${module.settings.jobs}"}
    assert len(mine) == 1 and jobs_module(cloud) == module(cloud)
    for key in ("name", "id", "image", "cpu", "memory_mb"):
        assert re.search(rf"\b{key}\s+= ", outputs["jobs"]["value"]), f"{cloud}-jobs: the jobs output has no {key}"


def server_catalog(exported: dict[str, Any], provider: str, options: dict[str, dict[str, str]]) -> dict[str, Any]:
    """modules/settings' server_catalog in Python (tests/test_terraform.py checks the HCL is still
    the one mirrored): each tool on `provider` with its job's options, classes' options dropped."""
    data = json.loads(json.dumps(exported["catalog"]))
    for rc in data["resource_classes"].values():
        rc["provider_options"] = {}
    for tool, spec in data["tools"].items():
        kept = {k: v for k, v in (spec.get("provider_options") or {}).items() if k in ("stuck_after_s", "on_stuck")}
        spec["provider"] = provider
        spec["provider_options"] = {**kept, **options[tool]}
    return data


@pytest.mark.anyio
async def test_a_laptop_runs_a_catalog_tool_on_batch_with_the_aws_jobs_modules_outputs(
        moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    name = unquote(blocks(module("aws"), "variable")["name"]["default"])
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/controlplane-tools:0.1.0"
    done = subprocess.run([sys.executable, "-m", "controlplane.cli", "catalog", "export",
                           str(ROOT / "controlplane" / "default_catalog.toml"), "--default-image", image],
                          capture_output=True, text=True, check=True, timeout=60)
    exported = json.loads(done.stdout)

    # What the module makes, made in moto: names as main.tf writes them.
    batch, logs, s3 = (aws.client(s, moto) for s in ("batch", "logs", "s3"))
    role = aws.client("iam", moto).create_role(RoleName=f"{name}-batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ce = batch.create_compute_environment(computeEnvironmentName=f"{name}-ce", type="UNMANAGED", serviceRole=role)
    batch.create_job_queue(jobQueueName=name, state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}])
    log_group = f"/aws/batch/{name}"
    logs.create_log_group(logGroupName=log_group)
    bucket = f"{name}-objects-0001"
    s3.create_bucket(Bucket=bucket)
    definitions = {}
    for tool, job in exported["jobs"].items():
        definitions[tool] = batch.register_job_definition(
            jobDefinitionName=f"{name}-{tool.lower().replace('_', '-')}", type="container", platformCapabilities=["FARGATE"],
            containerProperties={"image": job["image"], "resourceRequirements": [
                {"type": "VCPU", "value": f"{job['cpu']:g}"}, {"type": "MEMORY", "value": str(job["memory_mb"])}],
                "networkConfiguration": {"assignPublicIp": "ENABLED"}})["jobDefinitionArn"]
    main = (module("aws") / "main.tf").read_text()
    assert 'name     = var.name' in main and 'name              = "/aws/batch/${var.name}"' in main
    assert "name                  = module.settings.job_names[each.key]" in main

    # The module's outputs, as the README has the user take them.
    catalog = server_catalog(exported, "aws_batch", {tool: {"job_queue": name, "job_definition": arn, "log_group": log_group}
                                                     for tool, arn in definitions.items()})
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    environment = {"CONTROLPLANE_OBJECT_STORE_URL": f"s3://{bucket}", "CONTROLPLANE_AWS_BATCH_REGION": aws.REGION,
                   "CONTROLPLANE_JOB_STORE_ACCESS": unquote(blocks(module("aws"), "variable")["job_store_access"]["default"])}
    assert set(environment) == environment_keys("aws")
    for k, v in {**environment, "CONTROLPLANE_CATALOG_PATH": str(tmp_path / "catalog.json")}.items():
        monkeypatch.setenv(k, v)

    # A laptop behind NAT: its jobs cannot call back (a dead public URL), so they report through the bucket.
    cp = ControlPlane(Settings(home=tmp_path / "home", public_url="http://127.0.0.1:9", **FAST))
    with aws.BatchExecutor(moto) as executor:
        async with Client(build_server(cp)) as client:
            agent = Agent(client)
            tid = await agent.submit(inputs={"progress_steps": 2, "result": {"on": "laptop"}})
            st = await agent.wait(tid, timeout=90)
            assert st["state"] == "succeeded", st
            result = await agent.call("get_task_result", task_id=tid)
            assert result["result"]["on"] == "laptop"
    [job] = [j.describe() for j in aws.backend()._jobs.values() if j.job_name.startswith("cp-")]
    assert job["jobDefinition"] == definitions["exercise"] and job["jobQueue"].endswith(f"job-queue/{name}")
    assert executor.runs
