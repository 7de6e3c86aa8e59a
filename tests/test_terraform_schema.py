"""Every resource and data source in terraform/ checked against its provider's own schema, offline.

No terraform binary can run here, so `terraform validate` cannot either. The schemas come from
the prebuilt CDK for Terraform provider packages (tests/terraform_schema.py says how they are
read); .ci/run downloads the versions pinned in tests/terraform_providers.txt into
.ci/providers. For every module and example: each resource and data source type exists in the
provider it belongs to (its `provider` meta-argument, else its type's prefix, resolved through
the directory's required_providers, which must declare it), every argument and block it sets
exists at that nesting, as an argument or as a block as written, blocks of at most one are not
repeated, and nothing required is missing. And each required_providers constraint admits the
validated version and nothing older in its major, nor the next major.

What it cannot see: expressions (types, references, functions) and what the provider's own
validation refuses at plan (value ranges, enum values); those need `terraform plan`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from tests.conftest import ROOT
from tests.terraform_schema import PACKAGES, Block, Provider, load, wheels
from tests.test_terraform import EXAMPLES, MODULES, TERRAFORM, parsed, unquote

WHEELS = Path(os.environ.get("CONTROLPLANE_PROVIDER_WHEELS", ROOT / ".ci" / "providers"))
PINNED = ROOT / "tests" / "terraform_providers.txt"
META = {"count", "for_each", "provider", "depends_on", "lifecycle", "provisioner", "connection"}
HCL2_KEYS = {"__is_block__", "__comments__", "__inline_comments__"}


def providers() -> dict[str, Provider]:
    """Registry source -> schema of each pinned provider package, from .ci/providers."""
    pins = dict(line.split("==") for line in PINNED.read_text().split() if "==" in line)
    found = wheels(WHEELS)
    missing = [p for p in pins if not any(w.name.startswith(f"{p.replace('-', '_')}-{pins[p]}-") for w in found.values())]
    if missing:
        if os.environ.get("CONTROLPLANE_REQUIRE_SCHEMAS") == "1":
            pytest.fail(f"provider schema packages required (CONTROLPLANE_REQUIRE_SCHEMAS=1) but missing: {missing}")
        pytest.skip(f"provider schema packages not downloaded into {WHEELS} (.ci/run does): {missing}")
    assert set(pins) == set(PACKAGES.values())
    return {source: load(found[source]) for source in PACKAGES}


@pytest.fixture(scope="module")
def schemas() -> dict[str, Provider]:
    return providers()


# ---- the schema reading itself, on resources whose shape is known --------------------------------
def test_the_assemblies_are_read_as_the_providers_document_them(schemas: dict[str, Provider]) -> None:
    aws, google, beta, azurerm = (schemas[f"hashicorp/{p}"] for p in ("aws", "google", "google-beta", "azurerm"))
    assert {p.source for p in schemas.values()} == set(PACKAGES)
    # aws_batch_compute_environment (6.x): `type` required, `name_prefix` (no longer
    # `compute_environment_name_prefix`), compute_resources a block of at most one whose
    # `max_vcpus` and `subnets` are required and whose ec2_configuration is a repeated block
    ce = aws.resources["aws_batch_compute_environment"]
    assert ce.attributes["type"] is True and ce.attributes["name_prefix"] is False
    assert "compute_environment_name_prefix" not in ce.attributes
    cr = ce.blocks["compute_resources"]
    assert cr.single and not cr.required
    assert cr.body.attributes["max_vcpus"] is True and cr.body.attributes["security_group_ids"] is False
    assert cr.body.blocks["ec2_configuration"].single is False
    # names cdktf re-cases are restored from the registry anchors, not guessed
    assert "cidr_ipv4" in aws.resources["aws_vpc_security_group_ingress_rule"].attributes
    assert "google_cloud_run_v2_job" in google.resources and "aws_region" in aws.data_sources
    # google_cloud_run_v2_job: template (one, required) > template > containers (repeated), whose
    # resources.limits is a map argument, not a block; run_execution_token is google-beta's only
    job = google.resources["google_cloud_run_v2_job"]
    assert job.blocks["template"].single and job.blocks["template"].required
    containers = job.blocks["template"].body.blocks["template"].body.blocks["containers"]
    assert not containers.single and containers.body.attributes["image"] is True
    assert "limits" in containers.body.blocks["resources"].body.attributes
    assert "run_execution_token" not in job.attributes
    assert "run_execution_token" in beta.resources["google_cloud_run_v2_job"].attributes
    # azurerm_container_app_job: `secret` and `registry` repeat, `identity` is one
    app_job = azurerm.resources["azurerm_container_app_job"]
    assert app_job.attributes["replica_timeout_in_seconds"] is True
    assert not app_job.blocks["secret"].single and app_job.blocks["identity"].single
    # an argument SDKv2 also takes as blocks (azurerm_network_security_group.security_rule)
    rule = azurerm.resources["azurerm_network_security_group"].blocks["security_rule"]
    assert rule.argument and not rule.single and "priority" in rule.body.attributes
    assert not app_job.blocks["template"].argument


# ---- the check ---------------------------------------------------------------------------------
def required_providers(directory: Path) -> dict[str, tuple[str, str]]:
    """local name -> (registry source, version constraint) declared in a directory."""
    out: dict[str, tuple[str, str]] = {}
    for tf in sorted(directory.glob("*.tf")):
        for terraform in parsed(tf).get("terraform", []):
            for rp in terraform.get("required_providers", []):
                for name, spec in rp.items():
                    if name not in HCL2_KEYS:
                        out[name] = (unquote(spec["source"]), unquote(spec.get("version", "")))
    return out


def is_block(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(b, dict) and b.get("__is_block__") for b in value)


def problems_in(body: dict[str, Any], schema: Block, where: str, top: bool) -> list[str]:
    """What Terraform would refuse in one body against its schema (nothing when it fits)."""
    found: list[str] = []
    given_blocks: set[str] = set()
    for key, value in body.items():
        if key in HCL2_KEYS or (top and key in META):
            continue
        if key == "dynamic":
            for dyn in value:
                for label, spec in dyn.items():
                    if label in HCL2_KEYS:
                        continue
                    name = unquote(label)
                    if name not in schema.blocks:
                        found.append(f"{where}: dynamic {name!r}: no block type of that name")
                        continue
                    given_blocks.add(name)
                    for content in spec.get("content", []):
                        found += problems_in(content, schema.blocks[name].body, f"{where}.{name}", False)
            continue
        if key in schema.attributes:
            if is_block(value):
                found.append(f"{where}: {key!r} is an argument, written as a block")
        elif key in schema.blocks:
            nested = schema.blocks[key]
            if not is_block(value):
                if nested.argument:
                    continue
                found.append(f"{where}: {key!r} is a block, written as an argument")
                continue
            given_blocks.add(key)
            if nested.single and len(value) > 1:
                found.append(f"{where}: at most one {key!r} block, {len(value)} given")
            for item in value:
                found += problems_in(item, nested.body, f"{where}.{key}", False)
        else:
            found.append(f"{where}: unsupported argument or block {key!r}")
    found += [f"{where}: required argument {name!r} missing" for name, required in schema.attributes.items()
              if required and name not in body]
    found += [f"{where}: required block {name!r} missing" for name, nested in schema.blocks.items()
              if nested.required and name not in given_blocks]
    return found


def problems(directory: Path, schemas: dict[str, Provider]) -> list[str]:
    """Every schema problem of the resources and data sources of one module or example."""
    declared = required_providers(directory)
    found: list[str] = []
    for tf in sorted(directory.glob("*.tf")):
        for kind in ("resource", "data"):
            for block in parsed(tf).get(kind, []):
                for rtype, named in block.items():
                    rtype = unquote(rtype)
                    for name, body in named.items():
                        where = f"{tf.relative_to(TERRAFORM)}: {'data.' if kind == 'data' else ''}{rtype}.{unquote(name)}"
                        local = unquote(str(body.get("provider", rtype.split("_")[0]))).strip("${}").split(".")[0]
                        if local not in declared:
                            found.append(f"{where}: provider {local!r} is not in required_providers")
                            continue
                        provider = schemas.get(declared[local][0])
                        if provider is None:
                            found.append(f"{where}: no schema for {declared[local][0]}")
                            continue
                        types = provider.resources if kind == "resource" else provider.data_sources
                        if rtype not in types:
                            found.append(f"{where}: {provider.source} {provider.version} has no such {kind}")
                            continue
                        found += problems_in(body, types[rtype], where, True)
    return found


DIRECTORIES = MODULES + EXAMPLES


@pytest.mark.parametrize("directory", DIRECTORIES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_every_resource_fits_its_providers_schema(directory: Path, schemas: dict[str, Provider]) -> None:
    assert not problems(directory, schemas), "\n".join(problems(directory, schemas))


def admits(constraint: str, version: Version) -> bool:
    """Whether a Terraform version constraint (=, !=, >, >=, <, <=, ~>; comma-joined) admits a version."""
    for part in filter(None, (p.strip() for p in constraint.split(","))):
        m = re.fullmatch(r"(=|!=|>=|<=|>|<|~>)?\s*([\d.]+)", part)
        assert m, f"cannot read the constraint {constraint!r}"
        op, bound = m.group(1) or "=", Version(m.group(2))
        if op == "~>":
            n = len(m.group(2).split("."))
            upper = Version(".".join(str(x) for x in (*bound.release[: max(n - 2, 0)], bound.release[max(n - 2, 0)] + 1)))
            ok = bound <= version < upper
        else:
            ok = {"=": version == bound, "!=": version != bound, ">": version > bound, ">=": version >= bound,
                  "<": version < bound, "<=": version <= bound}[op]
        if not ok:
            return False
    return True


def test_the_constraint_reader() -> None:
    assert admits(">= 6.25, < 7", Version("6.99")) and not admits(">= 6.25, < 7", Version("7.0"))
    assert admits("~> 6.25", Version("6.30")) and not admits("~> 6.25", Version("7.0"))
    assert admits("~> 6.25.0", Version("6.25.9")) and not admits("~> 6.25.0", Version("6.26.0"))
    assert not admits(">= 5.40, < 7", Version("7.0.0")) and admits(">= 5.40, < 7", Version("5.40"))


@pytest.mark.parametrize("directory", DIRECTORIES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_provider_constraints_pin_the_validated_versions(directory: Path, schemas: dict[str, Provider]) -> None:
    """The validated version is admitted; no version older than it (a schema not checked), nor
    the next major (renames and removals happen there) is."""
    for local, (source, constraint) in required_providers(directory).items():
        assert source in schemas, f"{local}: {source} has no schema package (tests/terraform_schema.py)"
        v = Version(schemas[source].version)
        assert admits(constraint, v), f"{local} {constraint!r} does not admit the validated {v}"
        older = [Version(f"{v.major}.{v.minor - 1}.0")] if v.minor else []
        older += [Version(f"{v.major}.{v.minor}.{v.micro - 1}")] if v.micro else []
        assert not any(admits(constraint, o) for o in older), f"{local} {constraint!r} admits a version before {v}"
        assert not admits(constraint, Version(f"{v.major + 1}.0.0")), f"{local} {constraint!r} admits {v.major + 1}.x"
