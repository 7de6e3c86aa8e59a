"""Terraform provider schemas, read offline from the prebuilt CDK for Terraform provider packages.

Each `cdktf-cdktf-provider-<name>` wheel on PyPI is generated from one provider version's schema
and carries it in its jsii assembly (`_jsii/*.jsii.tgz`, a `package/.jsii` JSON document). The
assembly speaks TypeScript: a resource is a class whose summary links its registry page
(`{@link https://registry.terraform.io/providers/hashicorp/aws/6.25.0/docs/resources/s3_bucket
aws_s3_bucket}`), its arguments are the properties of the `<Class>Config` interface in camelCase.
What this module reads back, and how:

- the Terraform name of every argument from the registry anchor in its docs
  (`...#compute_resources BatchComputeEnvironment#compute_resources`), never by re-casing
  camelCase (which cannot restore `ipv4`, `v2`, or the renames cdktf makes for reserved words);
- a block from an attribute by the summary cdktf gives every block, `<name> block.`, and a type
  that is another interface of the assembly (an object attribute, or a map, is not a block);
- an argument typed as an interface that is not a block (an object, a list of objects) is kept
  with the blocks, marked `argument`: SDKv2 providers (azurerm's `security_rule`) take it written
  either way ("attributes as blocks"), and the assembly cannot tell those from the plugin
  framework's nested attributes, which take only `=`;
- nesting: a block typed as the interface itself holds at most one (max_items = 1), one typed as
  a list (or `IResolvable`) any number; `optional` absent means required (an attribute) or
  min_items >= 1 (a block).

Only the Config side is read: computed-only attributes are not arguments, so setting one fails
here as it does at plan. Reading the assembly needs no jsii runtime: a zip and a tar member.
"""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

# A provider's registry source -> the PyPI package carrying its schema.
PACKAGES = {
    "hashicorp/aws": "cdktf-cdktf-provider-aws",
    "hashicorp/google": "cdktf-cdktf-provider-google",
    "hashicorp/google-beta": "cdktf-cdktf-provider-google-beta",
    "hashicorp/azurerm": "cdktf-cdktf-provider-azurerm",
    "hashicorp/random": "cdktf-cdktf-provider-random",
    "hashicorp/time": "cdktf-cdktf-provider-time",
}

_LINK = re.compile(r"\{@link https://registry\.terraform\.io/providers/([\w-]+/[\w-]+)/([\w.-]+)/docs/"
                   r"(resources|data-sources)/(\w+) (\w+)\}")
_ANCHOR = re.compile(r"/docs/(?:resources|data-sources)/\w+#(\w+) \w+#\w+\}")


@dataclass(frozen=True)
class Block:
    """The body of a resource, data source or nested block: its arguments and its blocks."""

    attributes: dict[str, bool] = field(default_factory=dict)  # name -> required
    blocks: dict[str, Nested] = field(default_factory=dict)


@dataclass(frozen=True)
class Nested:
    """A nested block type: how many it takes and what is inside."""

    single: bool  # max_items = 1
    required: bool  # min_items >= 1
    body: Block
    argument: bool = False  # an object argument, which SDKv2 providers also take as blocks


@dataclass(frozen=True)
class Provider:
    """One provider version's resources and data sources, by Terraform type name."""

    source: str  # hashicorp/aws
    version: str  # 6.25.0, as the registry links in the assembly name it
    resources: dict[str, Block]
    data_sources: dict[str, Block]


def _docs_text(prop: dict[str, Any]) -> str:
    docs = prop.get("docs", {})
    return f"{docs.get('summary', '')}\n{docs.get('remarks', '')}"


def _interface(type_: dict[str, Any]) -> tuple[str | None, bool]:
    """(fqn of the interface a property is typed with, whether it is a single one) or (None, _)."""
    if "fqn" in type_:
        return (type_["fqn"], True) if type_["fqn"] != "cdktf.IResolvable" else (None, False)
    for t in type_.get("union", {}).get("types", []):
        coll = t.get("collection", {})
        if coll.get("kind") == "array" and "fqn" in coll.get("elementtype", {}):
            return coll["elementtype"]["fqn"], False
    coll = type_.get("collection", {})
    if coll.get("kind") == "array" and "fqn" in coll.get("elementtype", {}):
        return coll["elementtype"]["fqn"], False
    return None, False


def _block(types: dict[str, Any], fqn: str) -> Block:
    out = Block()
    for prop in types[fqn].get("properties", []):
        text = _docs_text(prop)
        anchor = _ANCHOR.search(text)
        if anchor is None:  # the meta-arguments (count, provider...) inherited from cdktf
            continue
        name = anchor.group(1)
        required = not prop.get("optional", False)
        nested, single = _interface(prop["type"])
        is_block = nested is not None and nested in types and prop.get("docs", {}).get("summary", "").strip() == f"{name} block."
        if nested is not None and nested in types:
            out.blocks[name] = Nested(single=single, required=required, body=_block(types, nested), argument=not is_block)
        else:
            out.attributes[name] = required
    return out


def assembly(wheel: Path) -> dict[str, Any]:
    """The jsii assembly (package/.jsii) inside a cdktf provider wheel."""
    with zipfile.ZipFile(wheel) as z:
        [member] = [n for n in z.namelist() if n.endswith(".jsii.tgz")]
        with z.open(member) as tgz, tarfile.open(fileobj=tgz, mode="r:gz") as tar:
            f = tar.extractfile("package/.jsii")
            assert f is not None
            return json.load(f)  # type: ignore[no-any-return]


@cache
def load(wheel: Path) -> Provider:
    """Every resource and data source of the provider version a wheel was generated from."""
    types = assembly(wheel)["types"]
    resources: dict[str, Block] = {}
    data_sources: dict[str, Block] = {}
    source = version = ""
    for fqn, t in types.items():
        if t.get("kind") != "class" or f"{fqn}Config" not in types:
            continue
        m = _LINK.search(t.get("docs", {}).get("summary", ""))
        if m is None:
            continue
        source, version, kind, _page, tf_type = m.groups()
        (resources if kind == "resources" else data_sources)[tf_type] = _block(types, f"{fqn}Config")
    return Provider(source=source, version=version, resources=resources, data_sources=data_sources)


def wheels(directory: Path) -> dict[str, Path]:
    """Registry source -> the provider wheel for it found in a directory."""
    found: dict[str, Path] = {}
    for source, package in PACKAGES.items():
        matches = sorted(directory.glob(f"{package.replace('-', '_')}-*.whl"))
        if matches:
            found[source] = matches[-1]
    return found
