"""The tool catalog: the tools operators allow agents to run, and the queues they run in.

A catalog is a TOML or YAML (or JSON) file with two tables:

    [resource_classes.cpu_small]        # one queue per resource class
    max_concurrency = 2                 # slots: tasks scheduled or running at once
    max_queue_length = 1000             # queued tasks beyond this answer QUEUE_OVERLOADED
    cpu = 1                             # the most a task of this class may ask for
    memory_mb = 2048

    [tools.lj_relax]
    description = "..."
    schema_version = 1
    provider = "local"
    resource_class = "cpu_small"
    command = ["{python}", "-m", "controlplane_tools.lj_relax"]
    image = "ghcr.io/org/tools:1"       # container providers only
    default_runtime_s = 600
    max_runtime_s = 3600
    estimate_s = 20
    [tools.lj_relax.retry]
    max_attempts = 2
    backoff_s = 5
    retry_on = ["worker_lost"]
    [tools.lj_relax.input_schema]       # JSON Schema 2020-12, an object schema
    ...

A tool may run in several places: `placements = [{ provider = "...", provider_options = {...} }, ...]`
in order of preference, instead of `provider` with `provider_options` (a list of one). Which of
them an attempt runs on is the scheduler's choice (`controlplane.placement`), recorded on its job.

Loading validates everything and reports every error at once, one a line, as
`<file>: tools.<name>.<field>: <problem>` (`tools.<name>.placements.<i>.<field>` for a listed
placement), including each placement's `provider` (a registered runner) and its
`provider_options` (the resource class's merged with the placement's), which are checked against
that provider's `Options` model (`controlplane.catalog_options`).

A running server may take a new catalog (`Catalog.adopt`, docs/design/catalog-reload.md): the
new contents replace the old in one assignment, and the definitions it replaced stay known, so a
task launches with the tool as it was when the task was admitted (`Catalog.admitted`).

A resource class's `scratch_mb` reserves nothing by itself: it caps what a task of the class may
ask for with `resources.scratch_mb`, and a task gets scratch disk only by asking, from a provider
that can guarantee it (`Capability.SCRATCH`; the submit is checked against what the provider
guarantees for the class's shape). A class that sets it for a tool whose provider can never
guarantee scratch disk (local, Cloud Run) in any of its placements is refused at load, rather than promising what no job
would get. Unset (the default), the provider's guarantee is the only limit.
"""

from __future__ import annotations

import time
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from controlplane.catalog_models import (
    RESERVED_NAMES,
    RETRYABLE,
    STORE_SCHEMES,
    TOOL_NAME_PATTERN,
    InputValidator,
    Placement,
    ResourceClass,
    RetryPolicy,
    ToolSpec,
)
from controlplane.catalog_options import CatalogError, Placed, all_placements, describe
from controlplane_providers.base import ProviderOptions

__all__ = ["RESERVED_NAMES", "RETRYABLE", "STORE_SCHEMES", "TOOL_NAME_PATTERN", "Catalog", "CatalogError", "Contents",
           "Definition", "InputValidator", "Placed", "Placement", "ResourceClass", "RetryPolicy", "ToolSpec",
           "default_catalog_text", "ensure_catalog", "file_format", "parse_data", "read_data", "server_problems"]


@dataclass(frozen=True)
class Contents:
    """One catalog's tools and queues, validated; replaced whole, never changed."""

    tools: dict[str, ToolSpec]
    resource_classes: dict[str, ResourceClass]
    placements: dict[str, tuple[Placed, ...]]  # each tool's, validated by their providers
    options: dict[str, ProviderOptions]  # each tool's first placement's options
    validators: dict[str, InputValidator]
    source: str


@dataclass(frozen=True)
class Definition:
    """A tool as a task admitted under it runs: the tool, its placements, its resource class."""

    tool: ToolSpec
    placements: tuple[Placed, ...]
    resource_class: ResourceClass


@dataclass(frozen=True)
class _Retired:
    until: float  # (epoch seconds) when a reload replaced or removed it
    value: Any  # (ToolSpec, its placements) or a ResourceClass


@dataclass
class _History:
    """What reloads replaced or removed, oldest first per name."""

    tools: dict[str, list[_Retired]] = field(default_factory=dict)
    resource_classes: dict[str, list[_Retired]] = field(default_factory=dict)


class Catalog:
    def __init__(self, tools: dict[str, ToolSpec], classes: dict[str, ResourceClass], source: str,
                 placements: dict[str, tuple[Placed, ...]] | None = None):
        if placements is None:
            placements, problems = all_placements(tools, classes, source)
            if problems:
                raise CatalogError(*problems)
        self._now = Contents(tools, classes, placements, {name: each[0].options for name, each in placements.items()},
                             {name: t.validator() for name, t in tools.items()}, source)
        self._history = _History()

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return self._now.tools

    @property
    def resource_classes(self) -> dict[str, ResourceClass]:
        return self._now.resource_classes

    @property
    def options(self) -> dict[str, ProviderOptions]:
        """Each tool's first placement's options."""
        return self._now.options

    def placements(self, tool_name: str) -> tuple[Placed, ...]:
        """Where the tool's jobs may run now, in the catalog's order (empty: no such tool)."""
        return self._now.placements.get(tool_name, ())

    @property
    def source(self) -> str:
        return self._now.source

    def tool(self, name: str) -> ToolSpec | None:
        return self.tools.get(name)

    def providers(self) -> list[str]:
        """The providers the catalog's tools run on (every placement's)."""
        return sorted({p.provider for each in self._now.placements.values() for p in each})

    def validator(self, name: str) -> InputValidator:
        return self._now.validators[name]

    def store_urls(self) -> set[str]:
        """Every object store the catalog names (besides the server's default)."""
        urls = {t.object_store for t in self.tools.values()} | {r.object_store for r in self.resource_classes.values()}
        return {u for u in urls if u}

    # ---- reloading ------------------------------------------------------------------------
    def adopt(self, new: Catalog) -> None:
        """Take `new`'s contents in one assignment (readers see the old catalog or the new, whole).
        The tools and resource classes it changes or removes are kept as they were, for the
        tasks admitted before (`admitted`, `queues`)."""
        old, now = self._now, time.time()
        for name, tool in old.tools.items():
            if new.tools.get(name) != tool or new._now.placements.get(name) != old.placements[name]:
                self._history.tools.setdefault(name, []).append(_Retired(now, (tool, old.placements[name])))
        for name, rc in old.resource_classes.items():
            if new.resource_classes.get(name) != rc:
                self._history.resource_classes.setdefault(name, []).append(_Retired(now, rc))
        self._now = new._now

    def admitted(self, tool_name: str, resource_class: str, submitted_at: float) -> Definition:
        """The tool and the resource class as they were when a task submitted at `submitted_at`
        was admitted: the current ones unless a reload since replaced them. LookupError when this
        process never knew them (removed from the catalog before a restart)."""
        now = self._now
        tool = _as_of(self._history.tools.get(tool_name, ()), submitted_at)
        if tool is None and tool_name in now.tools:
            tool = (now.tools[tool_name], now.placements[tool_name])
        rc = _as_of(self._history.resource_classes.get(resource_class, ()), submitted_at) \
            or now.resource_classes.get(resource_class)
        if tool is None:
            raise LookupError(f"tool '{tool_name}' is no longer in the catalog")
        if rc is None:
            raise LookupError(f"resource class '{resource_class}' is no longer in the catalog")
        spec, placements = tool
        return Definition(spec, placements, rc)

    def placements_at(self, tool_name: str, submitted_at: float) -> tuple[Placed, ...]:
        """The tool's placements as a task submitted at `submitted_at` was admitted under (as
        `admitted`, for the scheduler's every claim: one lookup unless a reload replaced the tool);
        empty when this process never knew the tool."""
        kept = self._history.tools.get(tool_name)
        then = _as_of(kept, submitted_at) if kept else None
        return then[1] if then is not None else self._now.placements.get(tool_name, ())

    def queues(self) -> list[ResourceClass]:
        """The resource classes to schedule: the catalog's, and those a reload removed (their
        tasks admitted before still run, in the class as it was last)."""
        now = self._now.resource_classes
        return [*now.values(), *(kept[-1].value for name, kept in self._history.resource_classes.items()
                                 if name not in now)]

    # ---- loading --------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Catalog:
        return cls.from_data(read_data(path), source=str(path))

    @classmethod
    def parse(cls, text: str, *, source: str = "<catalog>", fmt: Literal["toml", "yaml"] = "toml") -> Catalog:
        return cls.from_data(parse_data(text, source=source, fmt=fmt), source=source)

    @classmethod
    def from_data(cls, data: Any, *, source: str) -> Catalog:
        """A catalog from its decoded tables (TOML, YAML or JSON: JSON is YAML). CatalogError
        lists every problem found, not only the first."""
        if not isinstance(data, dict):
            raise CatalogError(f"{source}: the catalog must be a table of tables")
        problems: list[str] = []
        unknown = set(data) - {"tools", "resource_classes"}
        if unknown:
            problems.append(f"{source}: unknown top-level keys {sorted(unknown)}")

        classes: dict[str, ResourceClass] = {}
        for name, body in _tables(data, "resource_classes", source, problems).items():
            where = f"resource_classes.{name}"
            rc = _build(ResourceClass, _table(body, name, source, where, problems), source, where, problems)
            if rc is not None:
                classes[name] = rc
        if not data.get("resource_classes"):
            problems.append(f"{source}: resource_classes: at least one resource class is required")

        tools: dict[str, ToolSpec] = {}
        declared = sorted(n for n, body in (data.get("resource_classes") or {}).items()) \
            if isinstance(data.get("resource_classes"), dict) else []
        for name, body in _tables(data, "tools", source, problems).items():
            where = f"tools.{name}"
            spec = _build(ToolSpec, _table(body, name, source, where, problems), source, where, problems)
            if spec is None:
                continue
            if spec.resource_class not in declared:
                problems.append(f"{source}: {where}.resource_class: unknown resource class '{spec.resource_class}'"
                                f" (declared: {', '.join(declared)})")
            elif spec.resource_class in classes:
                tools[name] = spec
        placements, placement_problems = all_placements(tools, classes, source)
        problems += placement_problems
        if problems:
            raise CatalogError(*problems)
        return cls(tools, classes, source, placements)


def _as_of(retired: Any, at: float) -> Any:
    """The value that was current at `at`, if a reload replaced it since (else None)."""
    return next((r.value for r in retired if at < r.until), None)


def read_data(path: Path) -> Any:
    """A catalog file's decoded tables, unvalidated: YAML (or JSON) by its suffix, else TOML."""
    try:
        raw_text = path.read_text()
    except OSError as e:
        raise CatalogError(f"{path}: cannot read catalog: {e.strerror}") from None
    return parse_data(raw_text, source=str(path), fmt=file_format(path))


def file_format(path: Path) -> Literal["toml", "yaml"]:
    """YAML (or JSON) by its suffix, else TOML."""
    return "yaml" if path.suffix in (".yaml", ".yml", ".json") else "toml"


def parse_data(text: str, *, source: str, fmt: Literal["toml", "yaml"]) -> Any:
    try:
        return tomllib.loads(text) if fmt == "toml" else (yaml.safe_load(text) or {})
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise CatalogError(f"{source}: not valid {fmt.upper()}: {e}") from None


def _tables(data: dict[str, Any], key: str, source: str, problems: list[str]) -> dict[str, Any]:
    body = data.get(key) or {}
    if not isinstance(body, dict):
        problems.append(f"{source}: {key}: must be a table")
        return {}
    return body


def _table(body: Any, name: str, source: str, where: str, problems: list[str]) -> dict[str, Any] | None:
    """The entry's table with its name, or None (a problem added) when it is not a table."""
    if not isinstance(body, dict):
        problems.append(f"{source}: {where}: must be a table")
        return None
    return {"name": name, **body}


def _build(model: type[BaseModel], data: dict[str, Any] | None, source: str, where: str,
           problems: list[str]) -> Any:
    """The model, or None with its every problem added to `problems`."""
    if data is None:
        return None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems += [f"{source}: {where}.{field_}: {msg}" for field_, msg in describe(e)]
        return None


def server_problems(catalog: Catalog, *, max_ttl_s: int) -> list[str]:
    """What a server with these settings refuses in a catalog that is valid by itself."""
    return [f"{catalog.source}: tools.{t.name}.ttl_s: {t.ttl_s} exceeds the server's max_ttl_s ({max_ttl_s})"
            for t in catalog.tools.values() if t.ttl_s and t.ttl_s > max_ttl_s]


def default_catalog_text() -> str:
    return resources.files("controlplane").joinpath("default_catalog.toml").read_text()


def ensure_catalog(path: Path) -> Catalog:
    """Load the catalog at `path`, writing the default catalog there on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(default_catalog_text())
        try:
            tmp.replace(path) if not path.exists() else tmp.unlink()
        except OSError:
            tmp.unlink(missing_ok=True)
    return Catalog.load(path)

