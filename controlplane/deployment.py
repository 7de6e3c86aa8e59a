"""The catalog as a cloud deployment reads it, and the check of a deployment against a catalog.

The Terraform modules (`terraform/modules/*`) make one cloud job per catalog tool. They cannot read
TOML, so `controlplane catalog export` converts the operator's catalog into the JSON they
`jsondecode`:

    {"format": 1,
     "jobs":    {"<tool>": {"image", "cpu", "memory_mb", "gpu", "max_runtime_s", "resource_class"}},
     "catalog": {the catalog's own tables, each tool's image filled in}}

`jobs` is what the modules' one `for_each` makes jobs from (the resource class's cpu and memory
taken onto each tool); `catalog` is what the module hands the server (CONTROLPLANE_CATALOG_JSON),
after pointing each tool's provider and provider_options at the job made for it. Both come from
one validated catalog, so the jobs and the tools the server offers cannot disagree.

`check` compares a catalog with a deployment's `terraform output -json` (its `jobs` output:
tool -> the job's name, id, image, cpu and memory as the cloud resource has them, and every other
output named `<cloud>_jobs` of the same shape: a deployment whose tools run on the jobs of
several clouds has one such map per cloud) and lists every difference. This module reads and
compares; it never calls a cloud.

`local_paths` finds what a tool's command names on this machine (a path under the user's home,
the control plane's home, the working directory, the checkout or the temporary directory): a
cloud job runs in its image, where such a path is unlikely to exist. The export warns of each
and goes on; `{python}` is the image's interpreter, and a module run with `-m` is found by name.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from controlplane.catalog import Catalog, read_data

FORMAT = 1


class DeploymentError(ValueError):
    """The catalog cannot be deployed as it is, or the outputs are not a deployment's."""


def export(path: Path, *, default_image: str | None = None,
           warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The catalog at `path`, validated, in the form the Terraform modules read. `warn` hears of
    every path on this machine a tool's command names (`local_paths`)."""
    data = read_data(path)
    catalog = Catalog.from_data(data, source=str(path))
    if warn is not None:
        for problem in local_paths(catalog):
            warn(f"{path}: {problem}")
    jobs: dict[str, dict[str, Any]] = {}
    for name, tool in sorted(catalog.tools.items()):
        image = tool.image or default_image
        if not image:
            raise DeploymentError(f"{path}: tools.{name}.image: a cloud job runs an image; set one for the tool, "
                                  "or give --default-image for the tools without one")
        rc = catalog.resource_classes[tool.resource_class]
        jobs[name] = {"image": image, "cpu": _number(rc.cpu), "memory_mb": rc.memory_mb, "gpu": rc.gpu,
                      "max_runtime_s": tool.max_runtime_s, "resource_class": rc.name}
        data["tools"][name]["image"] = image
    return {"format": FORMAT, "jobs": jobs, "catalog": data}


def local_roots() -> list[Path]:
    """Where paths of this machine live that a tool's image will not have."""
    import controlplane
    from controlplane.settings import Settings

    roots = [Path.home(), Settings().home, Path.cwd(), Path(controlplane.__file__).parents[1], Path(tempfile.gettempdir())]
    return [r.resolve() for r in roots if r.resolve() != Path("/")]  # a working directory of / is no hint


def local_paths(catalog: Catalog, roots: list[Path] | None = None) -> list[str]:
    """Each tool command's argument that names a path on this machine: `~...`, or an absolute
    path under one of `roots` (default `local_roots()`), also after `--option=`."""
    roots = local_roots() if roots is None else roots
    found = []
    for name, tool in sorted(catalog.tools.items()):
        for arg in tool.command:
            value = arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg
            if "{python}" in value or not value.startswith(("/", "~")):
                continue
            where = Path(os.path.expanduser(value))
            if value.startswith("~") or any(where.is_relative_to(r) or _under(value, r) for r in roots):
                found.append(f"tools.{name}.command: '{value}' is a path on this machine; a cloud job runs in "
                             "its image, where it will not exist (run a module with {python} -m, or name a "
                             "path inside the image)")
    return found


def _under(value: str, root: Path) -> bool:
    """`value` names a path under `root`, also when `root` is reached through a symbolic link."""
    try:
        return Path(value).resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return PurePosixPath(value).is_relative_to(PurePosixPath(root))


def check(path: Path, outputs: Any, *, default_image: str | None = None) -> list[str]:
    """Every difference between the catalog at `path` and a deployment's outputs (empty: none).

    `outputs` is `terraform output -json` (every output, each `{"value": ...}`: its `jobs` and
    each `<cloud>_jobs`, a difference in one of those named by it) or `terraform output -json
    jobs` (that output's value alone)."""
    wanted = export(path, default_image=default_image)["jobs"]
    problems = []
    for output, deployed in _jobs_outputs(outputs).items():
        side = "" if output == "jobs" else f"{output}: "
        problems += [f"{side}tool '{name}': no job in the deployment (apply the module with this catalog)"
                     for name in sorted(set(wanted) - set(deployed))]
        problems += [f"{side}job for '{name}' ({_job_name(deployed[name])}): no such tool in the catalog"
                     for name in sorted(set(deployed) - set(wanted))]
        for name in sorted(set(wanted) & set(deployed)):
            job = deployed[name]
            for field in ("image", "cpu", "memory_mb"):
                have, want = job.get(field), wanted[name][field]
                if not _same(have, want):
                    problems.append(f"{side}tool '{name}': {field} is {want!r} in the catalog but {have!r} in job "
                                    f"{_job_name(job)}")
    return problems


def _jobs_outputs(outputs: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """The outputs' tool -> job maps, by output name (`jobs` first)."""
    found: dict[str, Any] = {"jobs": outputs}
    if isinstance(outputs, dict) and outputs and all(isinstance(v, dict) and "value" in v for v in outputs.values()):
        # every output, each {"value", "type", "sensitive"}
        found = {"jobs": outputs.get("jobs", {}).get("value")}
        found |= {name: o["value"] for name, o in sorted(outputs.items()) if name.endswith("_jobs")}
    for value in found.values():
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise DeploymentError("the outputs have no `jobs` map (tool -> job): give `terraform output -json` of a "
                                  "root module that passes the module's `jobs` output on")
    return found


def _job_name(job: dict[str, Any]) -> str:
    return str(job.get("id") or job.get("name") or "?")


def _number(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, int | float) and not isinstance(want, bool):
        try:
            return float(have) == float(want)  # Terraform outputs numbers as numbers or strings
        except (TypeError, ValueError):
            return False
    return bool(have == want)


def dumps(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(doc, sort_keys=True))
    return json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"
