"""Prices and usage: what an attempt used, and what that costs at list price.

An attempt's usage is its run time (from its job's start to its end, as the provider or else the
runner reports them) times its shape (the cpu, memory and GPUs its job was launched with,
`launch.asked_shape`): vCPU-seconds, GiB-seconds of memory, GPU-seconds. The price table turns
usage into an estimated cost, by provider and region:

* the defaults are `default_prices.toml` (public list prices, dated, each entry naming its
  source page);
* an operator's file (`CONTROLPLANE_PRICES_FILE`, default `$CONTROLPLANE_HOME/prices.toml` when it
  exists), in the same form, overrides them rate by rate: `[aws_batch.us-east-1] gpu_per_hour =
  3.06` adds a GPU rate and keeps the others. A file naming another `currency` replaces the
  defaults entirely (they are in USD and cannot be converted here).

A job's region is what its provider says it runs in (`Provider.price_region`: Batch's region,
Cloud Run's `region`, Container Apps' `region` option); a region the table does not list takes
the provider's `default` entry. A rate that is not in the table is unknown, and an attempt that
used what it prices has no cost (None), never a cost of zero.

Costs are computed once, when an attempt ends, with the table in force then, and kept with its
usage (`attempt_usage`): a later change of prices does not rewrite what was spent.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.catalog import Catalog
from controlplane.launch import asked_shape
from controlplane.store.rows import JobRow, TaskRow
from controlplane_providers.base import Provider, ProviderOptions

RESOURCES = ("vcpu", "memory_gib", "gpu")


class PriceError(ValueError):
    """The price file is unusable; the message names the file and the entry."""


class Rate(BaseModel):
    """One provider's prices in one region, per second of use of one unit (None: unknown)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vcpu: float | None = Field(default=None, ge=0)
    memory_gib: float | None = Field(default=None, ge=0)
    gpu: float | None = Field(default=None, ge=0)
    source: str | None = None


class _Entry(BaseModel):
    """An entry as written: each rate per hour or per second (not both)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vcpu_per_hour: float | None = Field(default=None, ge=0)
    vcpu_per_second: float | None = Field(default=None, ge=0)
    memory_gib_per_hour: float | None = Field(default=None, ge=0)
    memory_gib_per_second: float | None = Field(default=None, ge=0)
    gpu_per_hour: float | None = Field(default=None, ge=0)
    gpu_per_second: float | None = Field(default=None, ge=0)
    source: str | None = None

    @model_validator(mode="after")
    def _one_unit(self) -> _Entry:
        for r in RESOURCES:
            if getattr(self, f"{r}_per_hour") is not None and getattr(self, f"{r}_per_second") is not None:
                raise ValueError(f"{r}: give {r}_per_hour or {r}_per_second, not both")
        return self

    def per_second(self) -> dict[str, Any]:
        """The rates given, per second (the ones left out are absent, so an override keeps them)."""
        out: dict[str, Any] = {}
        for r in RESOURCES:
            hour, second = getattr(self, f"{r}_per_hour"), getattr(self, f"{r}_per_second")
            if hour is not None:
                out[r] = hour / 3600
            elif second is not None:
                out[r] = second
        if self.source is not None:
            out["source"] = self.source
        return out


@dataclass(frozen=True)
class PriceTable:
    currency: str
    as_of: str | None
    rates: dict[str, dict[str, Rate]]  # provider -> region (or "default") -> rate

    def rate(self, provider: str, region: str | None) -> Rate | None:
        regions = self.rates.get(provider) or {}
        return regions.get(region or "default") or regions.get("default")

    @classmethod
    def load(cls, override: Path | None = None) -> PriceTable:
        """The defaults, with the operator's file (if any) over them."""
        text = resources.files("controlplane").joinpath("default_prices.toml").read_text()
        currency, as_of, rates = _parse(text, "default_prices.toml")
        if override is not None and override.exists():
            try:
                text = override.read_text()
            except OSError as e:
                raise PriceError(f"{override}: cannot read the price file: {e.strerror}") from None
            o_currency, o_as_of, o_rates = _parse(text, str(override), currency)
            if o_currency != currency:
                currency, as_of, rates = o_currency, o_as_of, {}
            as_of = o_as_of or as_of
            for provider, regions in o_rates.items():
                for region, given in regions.items():
                    rates.setdefault(provider, {}).setdefault(region, {}).update(given)
        return cls(currency, as_of, {p: {r: Rate(**v) for r, v in regions.items()} for p, regions in rates.items()})


def _parse(text: str, source: str, currency: str = "USD") -> tuple[str, str | None, dict[str, dict[str, dict[str, Any]]]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PriceError(f"{source}: not valid TOML: {e}") from None
    currency = data.pop("currency", currency)
    as_of = data.pop("as_of", None)
    if not isinstance(currency, str) or not 0 < len(currency) <= 8 or not (as_of is None or isinstance(as_of, str)):
        raise PriceError(f"{source}: currency is a code of at most 8 characters (USD), as_of is text")
    rates: dict[str, dict[str, dict[str, Any]]] = {}
    for provider, regions in data.items():
        if not isinstance(regions, dict) or not all(isinstance(v, dict) for v in regions.values()):
            raise PriceError(f"{source}: {provider}: a table of regions, each a table of rates")
        for region, body in regions.items():
            try:
                rates.setdefault(provider, {})[region] = _Entry.model_validate(body).per_second()
            except ValidationError as e:
                first = e.errors()[0]
                field = ".".join(str(p) for p in first["loc"])
                where = f"{provider}.{region}" + (f".{field}" if field else "")
                raise PriceError(f"{source}: {where}: {first['msg'].removeprefix('Value error, ')}") from None
    return currency, as_of, rates


@dataclass(frozen=True)
class Usage:
    """What an attempt used (or a sum of attempts)."""

    run_s: float = 0.0
    vcpu_s: float = 0.0
    memory_gib_s: float = 0.0
    gpu_s: float = 0.0

    @classmethod
    def of_run(cls, run_s: float, cpu: float, memory_mb: int, gpu: int) -> Usage:
        run_s = max(0.0, run_s)
        return cls(run_s, run_s * cpu, run_s * memory_mb / 1024, run_s * gpu)

    def cost(self, rate: Rate | None) -> float | None:
        """At `rate`; None when a rate it needs is unknown."""
        if rate is None:
            return None
        total = 0.0
        for used, price in ((self.vcpu_s, rate.vcpu), (self.memory_gib_s, rate.memory_gib), (self.gpu_s, rate.gpu)):
            if used > 0:
                if price is None:
                    return None
                total += used * price
        return total

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.run_s + other.run_s, self.vcpu_s + other.vcpu_s, self.memory_gib_s + other.memory_gib_s,
                     self.gpu_s + other.gpu_s)

    def as_dict(self) -> dict[str, float]:
        return {"run_seconds": round(self.run_s, 3), "vcpu_seconds": round(self.vcpu_s, 3),
                "memory_gib_seconds": round(self.memory_gib_s, 3), "gpu_seconds": round(self.gpu_s, 3)}


@dataclass(frozen=True)
class Priced:
    """A task's shape and what it costs per second of running, where it runs."""

    cpu: float
    memory_mb: int
    gpu: int
    region: str | None
    rate: Rate | None

    def usage(self, run_s: float) -> Usage:
        return Usage.of_run(run_s, self.cpu, self.memory_mb, self.gpu)


class Pricing:
    """The price table applied to the catalog's tools on the providers that run them."""

    def __init__(self, table: PriceTable, catalog: Catalog, providers: dict[str, Provider[Any]]):
        self.table = table
        self.catalog = catalog
        self.providers = providers

    @property
    def currency(self) -> str:
        return self.table.currency

    def of(self, tool_name: str, provider_name: str, resource_class: str, resources_json: dict[str, Any]) -> Priced:
        """A task's shape (its `resources`, else its class's) and its provider's rate where it
        runs (its tool's first placement)."""
        return self._priced(provider_name, resource_class, resources_json, self.catalog.options.get(tool_name))

    def of_task(self, task: TaskRow) -> Priced:
        """`of` for a task on file, at its tool's first placement."""
        return self.of(task.tool_name, task.provider, task.resource_class, json.loads(task.resources_json or "{}"))

    def of_attempt(self, task: TaskRow, job: JobRow | None) -> Priced:
        """`of` for an attempt on file (its usage, ended or running), at the placement its job
        runs on (the task's first without a job)."""
        if job is None:
            return self.of_task(task)
        placed = self.catalog.placements(task.tool_name)
        here = placed[job.placement] if 0 <= job.placement < len(placed) else None
        options = here.options if here is not None and here.provider == job.provider else None
        return self._priced(job.provider, task.resource_class, json.loads(task.resources_json or "{}"), options)

    def at(self, provider_name: str, resource_class: str, resources_json: dict[str, Any],
           options: ProviderOptions | None) -> Priced:
        """A task's shape and the rate of the placement (provider and options) it would run on."""
        return self._priced(provider_name, resource_class, resources_json, options)

    def _priced(self, provider_name: str, resource_class: str, resources_json: dict[str, Any],
                options: ProviderOptions | None) -> Priced:
        rc = self.catalog.resource_classes.get(resource_class)
        shape = asked_shape(resources_json, rc) if rc is not None else {"cpu": 0.0, "memory_mb": 0, "gpu": 0}
        provider = self.providers.get(provider_name)
        region = provider.price_region(options) if provider is not None and options is not None else None
        return Priced(float(shape["cpu"]), int(shape["memory_mb"]), int(shape["gpu"]), region, self.table.rate(provider_name, region))

    def estimate(self, priced: Priced, runtime_s: float | None) -> float | None:
        """The cost of a run of `runtime_s` (the runtime estimate, from the tool's history)."""
        return None if runtime_s is None else priced.usage(runtime_s).cost(priced.rate)


def money(amount: float | None) -> float | None:
    """An amount as answers show it: to a millionth of the currency's unit."""
    return None if amount is None else round(amount, 6)


def summarize(rows: Sequence[dict[str, Any]], group_by: Sequence[str]) -> dict[str, Any]:
    """A usage report's groups (the store's sums per group, `UsageStore.report`) as answers show
    them, and their total (not when grouped by tag: a task with several tags is in several groups)."""
    groups, total, cost, unpriced = [], Usage(), 0.0, 0
    for r in rows:
        used = Usage(r["run_s"], r["vcpu_s"], r["memory_gib_s"], r["gpu_s"])
        groups.append({**{g: r[g] for g in group_by}, "tasks": r["tasks"], "attempts": r["attempts"],
                       "usage": used.as_dict(), "estimated_cost": money(r["cost"] or 0.0),
                       "unpriced_attempts": r["unpriced"]})
        total, cost, unpriced = total + used, cost + (r["cost"] or 0.0), unpriced + r["unpriced"]
    out: dict[str, Any] = {"groups": groups}
    if "tag" not in group_by:
        out["total"] = {"usage": total.as_dict(), "estimated_cost": money(cost), "unpriced_attempts": unpriced}
    return out
