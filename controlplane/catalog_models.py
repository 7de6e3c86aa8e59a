"""The catalog's entries as validated models: a tool (`ToolSpec`), where it may run
(`Placement`), the queue it runs in (`ResourceClass`), its retry policy, and the check of a
submit's inputs against its schema (`InputValidator`). `controlplane.catalog` loads them."""

from __future__ import annotations

from typing import Any, Literal, cast

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import ValidationError as SchemaValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from controlplane.objectstore.base import split_store_url

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
# How an attempt's placement is picked among the healthy ones with room (`controlplane.placement`):
# the catalog's order, or the lowest estimated cost at the price table.
PlacementPolicy = Literal["ordered", "cheapest"]


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
    # How its tools' attempts pick among their placements (a tool may say otherwise).
    placement_policy: PlacementPolicy = "ordered"

    @field_validator("object_store")
    @classmethod
    def _store_url(cls, v: str | None) -> str | None:
        return _check_store_url(v)


class Placement(_Strict):
    """One place a tool's jobs may run: a provider and its options (`options`, or
    `provider_options` as a tool writes them: one of the two; merged over the resource class's,
    then checked by that provider's Options model at load), and at most how many of the tool's
    jobs may run there at once (`max_running`; none: only the resource class's slots)."""

    provider: str = Field(min_length=1, max_length=64)
    provider_options: dict[str, Any] = Field(default_factory=dict)
    max_running: int | None = Field(default=None, ge=1, le=100_000)
    # How long a launched job may wait to start here before it is stopped and its attempt moves to
    # the next placement (None: as long as the provider lets it; a tool's only placement waits).
    patience_s: float | None = Field(default=None, gt=0)
    # Object stores (URLs or their prefixes) this placement's jobs reach by their own identity,
    # beyond their own cloud's (`controlplane.reachable`).
    reachable_stores: tuple[str, ...] = ()

    @field_validator("reachable_stores")
    @classmethod
    def _store_urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            _check_store_url(url)
        return v

    # The key its options were written under ("options" or "provider_options"): what errors name.
    _written: str = PrivateAttr(default="provider_options")

    @model_validator(mode="wrap")
    @classmethod
    def _options(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Placement:
        if not (isinstance(data, dict) and "options" in data):
            return cast(Placement, handler(data))
        if "provider_options" in data:
            raise ValueError("give options or provider_options, not both")
        try:
            placed = cast(Placement, handler({k: v for k, v in data.items() if k != "options"}
                                             | {"provider_options": data["options"]}))
        except ValidationError as e:  # named as written: `options`, not the field it fills
            raise ValidationError.from_exception_data(e.title, [
                cast(InitErrorDetails, {k: v for k, v in err.items() if k in ("type", "input", "ctx")}
                     | {"loc": ("options", *err["loc"][1:]) if err["loc"][:1] == ("provider_options",) else err["loc"]})
                for err in e.errors()]) from None
        placed._written = "options"
        return placed

    @property
    def options_key(self) -> str:
        """The key its options were written under in the catalog (errors name the field by it)."""
        return self._written


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
    # The largest file (MiB) an input marked `"x-controlplane-file": true` may refer to.
    max_input_file_mb: int = Field(default=100 * 1024, ge=1)
    # Object store for this tool's tasks (overrides the resource class's and the server's).
    object_store: str | None = None
    provider_options: dict[str, Any] = Field(default_factory=dict)
    # Where its jobs may run, as declared (empty: `provider` with `provider_options`, a list of one).
    placements: tuple[Placement, ...] = ()
    # How an attempt picks among them (none: its resource class's policy).
    placement_policy: PlacementPolicy | None = None

    @model_validator(mode="before")
    @classmethod
    def _first_placement(cls, data: Any) -> Any:
        """A tool that lists placements names no `provider` of its own: its first placement's is
        its `provider` (what a submit is checked and estimated against)."""
        if not isinstance(data, dict) or "placements" not in data:
            return data
        if "provider" in data or "provider_options" in data:
            raise ValueError("placements: give either placements or provider (with provider_options), not both")
        listed = data["placements"]
        if isinstance(listed, list | tuple) and not listed:
            raise ValueError("placements: at least one placement is required")
        first = listed[0] if isinstance(listed, list | tuple) else None
        if isinstance(first, dict) and isinstance(first.get("provider"), str):
            data = {**data, "provider": first["provider"]}
            options = first.get("options", first.get("provider_options"))
            if isinstance(options, dict):
                data["provider_options"] = options
        return data

    @field_validator("object_store")
    @classmethod
    def _store_url(cls, v: str | None) -> str | None:
        return _check_store_url(v)

    def each_placement(self) -> tuple[Placement, ...]:
        """Where the tool's jobs may run, in the catalog's order (at least one)."""
        return self.placements or (Placement(provider=self.provider, provider_options=self.provider_options),)

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
    (compiled, in Rust, far cheaper on every submit's path) only answers the common case first:
    valid inputs. Inputs it calls invalid are
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
