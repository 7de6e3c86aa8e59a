"""Each placement of each tool checked against its provider at catalog load: the provider is
registered, can keep what the resource class promises, and takes the options (the class's
`provider_options` merged with the placement's) by its `Options` model. Every problem names the
file, the tool (and for a declared list, the placement's index) and the field."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from controlplane.catalog_models import Placement, ResourceClass, ToolSpec
from controlplane_providers import registry
from controlplane_providers.base import Capability, ProviderOptions


class CatalogError(ValueError):
    """The catalog file is unusable. `problems` holds every problem found, each naming the file,
    the tool and the field; the message is all of them, one a line."""

    def __init__(self, *problems: str):
        self.problems: tuple[str, ...] = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Placed:
    """A placement as a job runs there: its provider and its options, validated, and the most
    jobs of its tool it may run at once (None: no limit of its own)."""

    provider: str
    options: ProviderOptions
    max_running: int | None = None
    patience_s: float | None = None  # how long a job may wait to start here (None: as its provider lets it)
    reachable_stores: tuple[str, ...] = ()  # stores its jobs reach beyond their own cloud's


def all_placements(tools: dict[str, ToolSpec], classes: dict[str, ResourceClass],
                   source: str) -> tuple[dict[str, tuple[Placed, ...]], list[str]]:
    """Each tool's placements, validated, and every problem found."""
    placed: dict[str, tuple[Placed, ...]] = {}
    problems: list[str] = []
    for name, tool in tools.items():
        rc = classes[tool.resource_class]
        each = []
        for i, p in enumerate(tool.each_placement()):
            where = f"tools.{name}.placements.{i}" if tool.placements else f"tools.{name}"
            try:
                each.append(Placed(p.provider, _options(tool, p, rc, source, where), p.max_running, p.patience_s,
                                   p.reachable_stores))
            except CatalogError as e:
                problems += e.problems
        if len(each) == len(tool.each_placement()):
            placed[name] = tuple(each)
    return placed, problems


def _options(tool: ToolSpec, p: Placement, rc: ResourceClass, source: str, where: str) -> ProviderOptions:
    """Validate a placement's options (its resource class's provider_options, overridden by its
    own) against its provider's Options model; errors name the file, the tool and the field (under
    the key the catalog wrote: `options` or `provider_options`), all of them."""
    try:
        model = registry.options_model(p.provider)
    except registry.ProviderUnavailable as e:
        raise CatalogError(f"{source}: {where}.provider: {e}") from None
    if rc.scratch_mb is not None and Capability.SCRATCH not in registry.provider_class(p.provider).capabilities:
        raise CatalogError(f"{source}: resource_classes.{rc.name}.scratch_mb: tool '{tool.name}' runs on the "
                           f"{p.provider} provider, which cannot reserve scratch disk for a job; remove scratch_mb")
    merged = {**rc.provider_options, **p.provider_options}
    context = {"cpu": rc.cpu, "memory_mb": rc.memory_mb, "gpu": rc.gpu, "scratch_mb": rc.scratch_mb,
               "resource_class": rc.name}
    try:
        return model.model_validate(merged, context=context)
    except ValidationError as e:
        problems = []
        for field_, msg in describe(e):
            top = field_.split(".", 1)[0]
            if top in rc.provider_options and top not in p.provider_options:
                msg += f" (from resource_classes.{rc.name}.provider_options)"
            problems.append(f"{source}: {where}.{p.options_key}.{field_}: {msg}")
        raise CatalogError(*problems) from None


def describe(e: ValidationError) -> list[tuple[str, str]]:
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
