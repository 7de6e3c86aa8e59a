"""The provider registry: job runners are plug-ins found by name.

A provider is a `controlplane_providers.base.Provider` subclass announced in the entry-point group
`controlplane.providers` of any installed distribution, so a third-party package adds a runner
without touching this repository:

    [project.entry-points."controlplane.providers"]
    my_runner = "my_package.runner:MyRunnerProvider"

The core asks this module for a provider by the name a catalog entry gives, never imports a
provider module itself, and never names one. A class is checked when it is loaded: it must be a
`Provider` with its own `Settings` and `Options` models, its own `handle_type` (a frozen `Handle`
dataclass: what the database stores for each job) and a `find` (a launch that may have happened
is looked up before it is repeated, so a runner that cannot find its jobs is refused).
Tests and embedders can `register(name, cls)` a class directly; a name is never registered twice.
"""

from __future__ import annotations

import threading
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import ValidationError

from controlplane_providers.base import Handle, Provider, ProviderContext, ProviderOptions, ProviderSettings

GROUP = "controlplane.providers"

_classes: dict[str, type[Provider[Any]]] = {}
_lock = threading.Lock()


class ProviderUnavailable(ValueError):
    """No usable provider of that name: unknown, its SDK is not installed, or it breaks the contract."""


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def names() -> list[str]:
    """Every provider name this installation knows."""
    return sorted(set(_entry_points()) | set(_classes))


def check_class(name: str, cls: Any) -> type[Provider[Any]]:
    """Refuse a class that does not honour the provider contract."""
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise ProviderUnavailable(f"provider {name}: {cls!r} is not a controlplane_providers.base.Provider")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        # `find` above all: without it a restart between intent and handle would launch twice.
        raise ProviderUnavailable(f"provider {name}: {cls.__name__} does not implement {', '.join(missing)}")
    if not issubclass(cls.Settings, ProviderSettings) or cls.Settings is ProviderSettings:
        raise ProviderUnavailable(f"provider {name}: {cls.__name__}.Settings must be its own ProviderSettings model")
    if not issubclass(cls.Options, ProviderOptions):
        raise ProviderUnavailable(f"provider {name}: {cls.__name__}.Options must be a ProviderOptions model")
    handle = cls.handle_type
    if (not (isinstance(handle, type) and issubclass(handle, Handle)) or handle is Handle
            or "__dataclass_params__" not in vars(handle)  # a dataclass of its own, not one inherited
            or not handle.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise ProviderUnavailable(f"provider {name}: {cls.__name__}.handle_type must be its own frozen Handle dataclass")
    return cls


def register(name: str, cls: type[Provider[Any]]) -> None:
    with _lock:
        known = _classes.get(name)
        if known is not None and known is not cls:
            raise ProviderUnavailable(f"provider {name} is registered already ({known.__module__}.{known.__name__})")
        _classes[name] = check_class(name, cls)


def provider_class(name: str) -> type[Provider[Any]]:
    """The class registered as `name`, loaded (and checked) on first use."""
    with _lock:
        cls = _classes.get(name)
    if cls is not None:
        return cls
    ep = _entry_points().get(name)
    if ep is None:
        raise ProviderUnavailable(f"unknown provider '{name}' (installed: {', '.join(names()) or 'none'})")
    try:
        loaded = ep.load()
    except ImportError as e:  # the runner's SDK is an optional extra
        extra = f"pip install 'mcp-controlplane[{', '.join(ep.extras)}]'" if ep.extras else "install its SDK"
        raise ProviderUnavailable(f"provider {name} needs {e.name or e}: {extra}") from None
    cls = check_class(name, loaded)
    with _lock:
        return _classes.setdefault(name, cls)


def options_model(name: str) -> type[ProviderOptions]:
    return provider_class(name).Options


def create(name: str, context: ProviderContext) -> Provider[Any]:
    """A provider instance with its settings read from the environment."""
    cls = provider_class(name)
    try:
        settings = cls.Settings()
    except ValidationError as e:
        first = e.errors()[0]
        prefix = str(cls.Settings.model_config.get("env_prefix", ""))
        var = prefix + "_".join(str(p) for p in first["loc"]).upper()
        raise ProviderUnavailable(f"provider {name}: setting {var}: {first['msg']}") from None
    return cls(settings, context)  # type: ignore[call-arg]
