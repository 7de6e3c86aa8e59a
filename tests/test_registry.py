"""Providers are plug-ins: found by name, checked against the contract when loaded, configured by
their own settings, and their catalog options validated when the catalog loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import SettingsConfigDict

from controlplane.catalog import Catalog, CatalogError, default_catalog_text
from providers import registry
from providers.base import Handle, JobStatus, LaunchSpec, Provider, ProviderContext, ProviderOptions, ProviderSettings
from providers.local import LocalProvider


class _Settings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_TOYRUNNER_", extra="ignore")
    speed: float = 1.0


class _Options(ProviderOptions):
    queue: str


class ToyRunner(Provider):
    name = "toyrunner"
    Settings = _Settings
    Options = _Options

    def __init__(self, settings: _Settings, context: ProviderContext):
        self.settings = settings

    def launch(self, spec: LaunchSpec) -> Handle:
        return {}

    def find(self, spec: LaunchSpec) -> Handle | None:
        return None

    def poll(self, handles: list[Handle]) -> list[JobStatus]:
        return []

    def cancel(self, handle: Handle, reason: str = "cancelled") -> None:
        pass


@pytest.fixture
def toy() -> Any:
    registry.register("toyrunner", ToyRunner)
    yield ToyRunner
    registry._classes.pop("toyrunner", None)


def test_the_installed_providers_are_found_by_entry_point() -> None:
    assert {"local", "aws_batch", "cloud_run"} <= set(registry.names())
    assert registry.provider_class("local") is LocalProvider


def test_a_provider_without_find_is_refused() -> None:
    class NoFind(Provider):
        Settings = _Settings

        def launch(self, spec: LaunchSpec) -> Handle:
            return {}

        def poll(self, handles: list[Handle]) -> list[JobStatus]:
            return []

        def cancel(self, handle: Handle, reason: str = "cancelled") -> None:
            pass

    with pytest.raises(registry.ProviderUnavailable, match="does not implement find"):
        registry.register("nofind", NoFind)
    with pytest.raises(registry.ProviderUnavailable, match="own ProviderSettings"):
        registry.register("nosettings", type("NoSettings", (ToyRunner,), {"Settings": ProviderSettings}))
    with pytest.raises(registry.ProviderUnavailable, match="is not a providers.base.Provider"):
        registry.register("notaprovider", object)  # type: ignore[arg-type]
    assert "nofind" not in registry.names()


def test_a_name_is_registered_once(toy: Any) -> None:
    registry.register("toyrunner", ToyRunner)  # the same class again is fine
    with pytest.raises(registry.ProviderUnavailable, match="registered already"):
        registry.register("toyrunner", type("Other", (ToyRunner,), {}))


def test_settings_come_from_the_providers_own_prefix(toy: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = ProviderContext(home=tmp_path, kill_grace_s=1.0, endpoint_file=tmp_path / "endpoint.json")
    monkeypatch.setenv("CONTROLPLANE_TOYRUNNER_SPEED", "2.5")
    assert registry.create("toyrunner", ctx).settings.speed == 2.5
    monkeypatch.setenv("CONTROLPLANE_TOYRUNNER_SPEED", "fast")
    with pytest.raises(registry.ProviderUnavailable, match="setting CONTROLPLANE_TOYRUNNER_SPEED"):
        registry.create("toyrunner", ctx)


def _catalog(provider: str, options: str) -> str:
    text = default_catalog_text()
    old = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "infra.tools.exercise"]'
    assert old in text
    return text.replace(old, f'provider = "{provider}"\nresource_class = "cpu_small"\n'
                             f'command = ["{{python}}", "-m", "infra.tools.exercise"]\nprovider_options = {{ {options} }}')


def test_catalog_options_are_validated_by_the_providers_model(toy: Any) -> None:
    catalog = Catalog.parse(_catalog("toyrunner", 'queue = "q1"'), source="cat.toml")
    assert catalog.options["exercise"] == _Options(queue="q1")
    with pytest.raises(CatalogError, match=r"^cat.toml: tools.exercise.provider_options.queue: Field required$"):
        Catalog.parse(_catalog("toyrunner", ""), source="cat.toml")
    with pytest.raises(CatalogError, match=r"^cat.toml: tools.exercise.provider_options.qeue: unknown field"):
        Catalog.parse(_catalog("toyrunner", 'queue = "q", qeue = "q"'), source="cat.toml")
    with pytest.raises(CatalogError, match=r"^cat.toml: tools.exercise.provider: unknown provider 'nosuch'"):
        Catalog.parse(_catalog("nosuch", ""), source="cat.toml")
    with pytest.raises(CatalogError, match=r"tools.exercise.provider_options.job_queue: Field required"):
        Catalog.parse(_catalog("aws_batch", 'job_definition = "d"'), source="cat.toml")
