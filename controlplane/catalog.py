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

Loading validates everything and reports every error at once, one a line, as
`<file>: tools.<name>.<field>: <problem>`, including each tool's `provider` (a registered runner)
and its `provider_options` (the resource class's merged with the tool's), which are checked
against that provider's `Options` model.

A running server may take a new catalog (`Catalog.adopt`, docs/design/catalog-reload.md): the
new contents replace the old in one assignment, and the definitions it replaced stay known, so a
task launches with the tool as it was when the task was admitted (`Catalog.admitted`).

A resource class's `scratch_mb` reserves nothing by itself: it caps what a task of the class may
ask for with `resources.scratch_mb`, and a task gets scratch disk only by asking, from a provider
that can guarantee it (`Capability.SCRATCH`; the submit is checked against what the provider
guarantees for the class's shape). A class that sets it for a tool whose provider can never
guarantee scratch disk (local, Cloud Run) is refused at load, rather than promising what no job
would get. Unset (the default), the provider's guarantee is the only limit.
"""

from __future__ import annotations

import time
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import jsonschema_rs
import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import ValidationError as SchemaValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from controlplane.objectstore.base import split_store_url
from controlplane_providers import registry
from controlplane_providers.base import Capability, ProviderOptions

TOOL_NAME_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_\-]{0,63}$"
# Names of the canonical tools; a catalog tool may not shadow them.
RESERVED_NAMES = frozenset(
    {
        "submit_task",
        "get_task_status",
        "tail_task_logs",
        "list_tasks",
        "cancel_task",
        "get_task_result",
        "wait_task",
        "usage_report",
    }
)
RETRYABLE = frozenset({"worker_lost", "launch_failed", "tool_failed"})


STORE_SCHEMES = ("file", "s3", "gs", "az")


def _check_store_url(v: str | None) -> str | None:
    if v is None:
        return v
    try:
        scheme, location, _ = split_store_url(v)
    except ValueError as e:
        raise ValueError(str(e)) from None
    if scheme not in STORE_SCHEMES or not location and scheme != "file":
        raise ValueError(f"'{v}' is not an object store URL (s3://bucket/prefix, gs://bucket/prefix, "
                         "az://account/container/prefix or file:///dir)")
    return v


class CatalogError(ValueError):
    """The catalog file is unusable. `problems` holds every problem found, each naming the file,
    the tool and the field; the message is all of them, one a line."""

    def __init__(self, *problems: str):
        self.problems: tuple[str, ...] = problems
        super().__init__("\n".join(problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryPolicy(_Strict):
    # Two budgets, counted apart: attempts in all when the tool itself fails (tool_failed), and
    # how many times a job lost, preempted or not launched runs again (worker_lost,
    # launch_failed; default max_attempts - 1). Each only for the kinds `retry_on` names.
    max_attempts: int = Field(default=1, ge=1, le=20)
    max_recoveries: int | None = Field(default=None, ge=0, le=100)
    backoff_s: float = Field(default=10.0, ge=0, le=3600)  # the first retry's wait; doubles, with jitter
    # Failures that earn another attempt. Scientific tools rarely benefit from re-running a
    # failed computation, so by default only infrastructure failures are retried.
    retry_on: tuple[str, ...] = ("worker_lost",)

    @field_validator("retry_on")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = set(v) - RETRYABLE
        if unknown:
            raise ValueError(f"unknown failure kinds {sorted(unknown)}; allowed: {sorted(RETRYABLE)}")
        return v


class ResourceClass(_Strict):
    # at most 64 printable characters: the store's resource_class columns (PostgreSQL refuses more)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")
    max_concurrency: int = Field(default=2, ge=1, le=100_000)
    max_queue_length: int = Field(default=1000, ge=0, le=10_000_000)
    cpu: float = Field(default=1, gt=0)
    memory_mb: int = Field(default=2048, gt=0)
    gpu: int = Field(default=0, ge=0)
    # The most scratch disk (MiB) a task may ask for (resources.scratch_mb); reserves nothing itself.
    scratch_mb: int | None = Field(default=None, ge=0)
    # Object store for the tasks of this class (s3://, gs://, az://, file://); default: the server's.
    object_store: str | None = None
    # Provider-specific settings (job queue, job definition, ...), read only by providers.
    provider_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("object_store")
    @classmethod
    def _store_url(cls, v: str | None) -> str | None:
        return _check_store_url(v)


class ToolSpec(_Strict):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = Field(min_length=1)
    schema_version: int = Field(default=1, ge=1)
    provider: str = "local"
    resource_class: str
    command: tuple[str, ...] = Field(min_length=1)
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    default_runtime_s: int = Field(default=3600, ge=1)
    max_runtime_s: int = Field(default=86_400, ge=1, le=30 * 86_400)
    estimate_s: float = Field(default=60.0, ge=0)
    # Input field whose size drives runtime estimates (a number, or the length of a string or array).
    size_feature: str | None = None
    ttl_s: int | None = Field(default=None, ge=1)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    input_schema: dict[str, Any]
    # Object store for this tool's tasks (overrides the resource class's and the server's).
    object_store: str | None = None
    provider_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("object_store")
    @classmethod
    def _store_url(cls, v: str | None) -> str | None:
        return _check_store_url(v)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v in RESERVED_NAMES:
            raise ValueError(f"'{v}' is the name of a canonical tool")
        return v

    @field_validator("input_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            Draft202012Validator.check_schema(v)
        except SchemaError as e:
            where = "/".join(str(p) for p in e.path) or "(root)"
            raise ValueError(f"not a valid JSON Schema 2020-12 at {where}: {e.message}") from None
        if v.get("type") != "object":
            raise ValueError("must be an object schema (type = \"object\")")
        if v.get("additionalProperties", False) is not False:
            raise ValueError("additionalProperties must be false: unknown arguments are rejected")
        return {"additionalProperties": False, **v}

    @model_validator(mode="after")
    def _runtime_bounds(self) -> ToolSpec:
        if self.default_runtime_s > self.max_runtime_s:
            raise ValueError(f"default_runtime_s: {self.default_runtime_s} exceeds max_runtime_s ({self.max_runtime_s})")
        if self.size_feature and self.size_feature not in self.input_schema.get("properties", {}):
            raise ValueError(f"size_feature: '{self.size_feature}' is not an input property")
        return self

    def validator(self) -> InputValidator:
        return InputValidator(self.input_schema)

    def input_size(self, inputs: dict[str, Any]) -> float | None:
        if not self.size_feature or self.size_feature not in inputs:
            return None
        v = inputs[self.size_feature]
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, int | float):
            return float(v)
        if isinstance(v, str | list | dict):
            return float(len(v))
        return None


class InputValidator:
    """A tool's input schema (JSON Schema 2020-12, formats not checked), as a submit checks it.

    `jsonschema` is the reference: it decides every refusal and words it. `jsonschema-rs`
    (compiled, in Rust) only answers the common case first: valid inputs, in about 0.1 µs where
    `jsonschema` takes 8-18 µs, on every submit's path (issue 13). Inputs it calls invalid are
    checked again by `jsonschema`, so a refusal reads as before, and where the two disagree
    (regular expressions: ECMA-262 there, Python's `re` here) `jsonschema` decides. A schema
    jsonschema-rs cannot compile is checked by `jsonschema` alone."""

    def __init__(self, schema: dict[str, Any]):
        self.reference = Draft202012Validator(schema)
        try:
            self.fast: Any = jsonschema_rs.Draft202012Validator(schema, validate_formats=False, offline=True)
        except Exception:  # noqa: BLE001 - a schema only the reference takes
            self.fast = None

    def is_valid(self, inputs: Any) -> bool:
        return not self.errors(inputs)

    def errors(self, inputs: Any) -> list[SchemaValidationError]:
        """What is wrong with `inputs`, ordered by where (empty: nothing)."""
        if self.fast is not None:
            try:
                if self.fast.is_valid(inputs):
                    return []
            except Exception:  # noqa: BLE001, S110 - a value it cannot convert (a mapping with a non-text key): ask the reference
                pass
        return sorted(self.reference.iter_errors(inputs), key=lambda e: [str(p) for p in e.path])


@dataclass(frozen=True)
class Contents:
    """One catalog's tools and queues, validated; replaced whole, never changed."""

    tools: dict[str, ToolSpec]
    resource_classes: dict[str, ResourceClass]
    options: dict[str, ProviderOptions]  # each tool's provider_options, validated by its provider
    validators: dict[str, InputValidator]
    source: str


@dataclass(frozen=True)
class Definition:
    """A tool as a task admitted under it runs: the tool, its provider options, its resource class."""

    tool: ToolSpec
    options: ProviderOptions
    resource_class: ResourceClass


@dataclass(frozen=True)
class _Retired:
    until: float  # (epoch seconds) when a reload replaced or removed it
    value: Any  # (ToolSpec, ProviderOptions) or a ResourceClass


@dataclass
class _History:
    """What reloads replaced or removed, oldest first per name."""

    tools: dict[str, list[_Retired]] = field(default_factory=dict)
    resource_classes: dict[str, list[_Retired]] = field(default_factory=dict)


class Catalog:
    def __init__(self, tools: dict[str, ToolSpec], classes: dict[str, ResourceClass], source: str,
                 options: dict[str, ProviderOptions] | None = None):
        if options is None:
            options, problems = _all_options(tools, classes, source)
            if problems:
                raise CatalogError(*problems)
        self._now = Contents(tools, classes, options, {name: t.validator() for name, t in tools.items()}, source)
        self._history = _History()

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return self._now.tools

    @property
    def resource_classes(self) -> dict[str, ResourceClass]:
        return self._now.resource_classes

    @property
    def options(self) -> dict[str, ProviderOptions]:
        return self._now.options

    @property
    def source(self) -> str:
        return self._now.source

    def tool(self, name: str) -> ToolSpec | None:
        return self.tools.get(name)

    def providers(self) -> list[str]:
        """The providers the catalog's tools run on."""
        return sorted({t.provider for t in self.tools.values()})

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
            if new.tools.get(name) != tool or new.options.get(name) != old.options[name]:
                self._history.tools.setdefault(name, []).append(_Retired(now, (tool, old.options[name])))
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
            tool = (now.tools[tool_name], now.options[tool_name])
        rc = _as_of(self._history.resource_classes.get(resource_class, ()), submitted_at) \
            or now.resource_classes.get(resource_class)
        if tool is None:
            raise LookupError(f"tool '{tool_name}' is no longer in the catalog")
        if rc is None:
            raise LookupError(f"resource class '{resource_class}' is no longer in the catalog")
        return Definition(*tool, rc)

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
        options, option_problems = _all_options(tools, classes, source)
        problems += option_problems
        if problems:
            raise CatalogError(*problems)
        return cls(tools, classes, source, options)


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


def _all_options(tools: dict[str, ToolSpec], classes: dict[str, ResourceClass],
                 source: str) -> tuple[dict[str, ProviderOptions], list[str]]:
    """Each tool's provider_options, validated, and every problem found."""
    options: dict[str, ProviderOptions] = {}
    problems: list[str] = []
    for name, tool in tools.items():
        try:
            options[name] = _provider_options(tool, classes[tool.resource_class], source)
        except CatalogError as e:
            problems += e.problems
    return options, problems


def _provider_options(tool: ToolSpec, rc: ResourceClass, source: str) -> ProviderOptions:
    """Validate a tool's provider_options (its resource class's, overridden by its own) against
    its provider's Options model; errors name the file, the tool and the field, all of them."""
    where = f"tools.{tool.name}"
    try:
        model = registry.options_model(tool.provider)
    except registry.ProviderUnavailable as e:
        raise CatalogError(f"{source}: {where}.provider: {e}") from None
    if rc.scratch_mb is not None and Capability.SCRATCH not in registry.provider_class(tool.provider).capabilities:
        raise CatalogError(f"{source}: resource_classes.{rc.name}.scratch_mb: tool '{tool.name}' runs on the "
                           f"{tool.provider} provider, which cannot reserve scratch disk for a job; remove scratch_mb")
    merged = {**rc.provider_options, **tool.provider_options}
    context = {"cpu": rc.cpu, "memory_mb": rc.memory_mb, "gpu": rc.gpu, "scratch_mb": rc.scratch_mb,
               "resource_class": rc.name}
    try:
        return model.model_validate(merged, context=context)
    except ValidationError as e:
        problems = []
        for field_, msg in _describe(e):
            top = field_.split(".", 1)[0]
            if top in rc.provider_options and top not in tool.provider_options:
                msg += f" (from resource_classes.{rc.name}.provider_options)"
            problems.append(f"{source}: {where}.provider_options.{field_}: {msg}")
        raise CatalogError(*problems) from None


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
        problems += [f"{source}: {where}.{field_}: {msg}" for field_, msg in _describe(e)]
        return None


def _describe(e: ValidationError) -> list[tuple[str, str]]:
    """Each error of a validation as (dotted field, problem)."""
    described = []
    for err in e.errors():
        field_ = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if not field_:  # a cross-field check names its field as "<field>: <problem>"
            field_, _, msg = msg.partition(": ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        described.append((field_, msg))
    return described


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

