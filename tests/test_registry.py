"""Providers are plug-ins: found by name, checked against the contract when loaded, configured by
their own settings, and their catalog options validated when the catalog loads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import SettingsConfigDict

from controlplane.catalog import Catalog, CatalogError, default_catalog_text
from controlplane_providers import registry
from controlplane_providers.base import (
    Handle,
    JobStatus,
    LaunchSpec,
    MalformedHandle,
    Provider,
    ProviderContext,
    ProviderOptions,
    ProviderSettings,
)
from controlplane_providers.local import LocalProvider


class _Settings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_TOYRUNNER_", extra="ignore")
    speed: float = 1.0


class _Options(ProviderOptions):
    queue: str


@dataclass(frozen=True)
class ToyHandle(Handle):
    ticket: str


class ToyRunner(Provider[ToyHandle]):
    name = "toyrunner"
    Settings = _Settings
    Options = _Options
    handle_type = ToyHandle

    def __init__(self, settings: _Settings, context: ProviderContext):
        self.settings = settings

    def launch(self, spec: LaunchSpec) -> ToyHandle:
        return ToyHandle(ticket=spec.job_name)

    def find(self, spec: LaunchSpec) -> ToyHandle | None:
        return None

    def poll(self, handles: list[ToyHandle]) -> list[JobStatus]:
        return []

    def cancel(self, handle: ToyHandle, reason: str = "cancelled") -> None:
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
    class NoFind(Provider[ToyHandle]):
        Settings = _Settings
        handle_type = ToyHandle

        def launch(self, spec: LaunchSpec) -> ToyHandle:
            return ToyHandle(ticket="t")

        def poll(self, handles: list[ToyHandle]) -> list[JobStatus]:
            return []

        def cancel(self, handle: ToyHandle, reason: str = "cancelled") -> None:
            pass

    with pytest.raises(registry.ProviderUnavailable, match="does not implement find"):
        registry.register("nofind", NoFind)
    with pytest.raises(registry.ProviderUnavailable, match="own ProviderSettings"):
        registry.register("nosettings", type("NoSettings", (ToyRunner,), {"Settings": ProviderSettings}))
    with pytest.raises(registry.ProviderUnavailable, match="is not a controlplane_providers.base.Provider"):
        registry.register("notaprovider", object)  # type: ignore[arg-type]
    # The database stores each job's handle: a provider brings its own frozen handle dataclass.
    with pytest.raises(registry.ProviderUnavailable, match="ToyLoose.handle_type must be its own frozen Handle"):
        registry.register("toyloose", type("ToyLoose", (ToyRunner,), {"handle_type": Handle}))

    class Undecorated(Handle):  # fields that encode() would never see
        ticket: str

    with pytest.raises(registry.ProviderUnavailable, match="handle_type must be its own frozen Handle dataclass"):
        registry.register("toyplain", type("ToyPlain", (ToyRunner,), {"handle_type": Undecorated}))
    assert not {"nofind", "toyloose", "toyplain"} & set(registry.names())


def test_a_stored_handle_decodes_to_the_providers_handle_or_fails_clearly(toy: Any, tmp_path: Path) -> None:
    runner = ToyRunner.configured(tmp_path)
    handle = runner.launch(_spec())
    stored = json.loads(json.dumps(handle.encode()))  # what jobs.handle_json holds
    assert stored == {"ticket": "cp-toy-a1"} and runner.handle(stored) == handle
    assert runner.handle({**stored, "added_by_a_later_version": 1}) == handle
    with pytest.raises(MalformedHandle, match=r"provider toyrunner: malformed ToyHandle \{\}: ticket: Field required"):
        runner.handle({})
    with pytest.raises(MalformedHandle, match="ticket: Input should be a valid string"):
        runner.handle({"ticket": 7})
    with pytest.raises(MalformedHandle, match="a ToyHandle is a JSON object, not list"):
        runner.handle(["cp-toy-a1"])  # type: ignore[arg-type]


def _spec() -> LaunchSpec:
    return LaunchSpec(task_id="tsk_toy", attempt=1, job_name="cp-toy-a1", tool_name="toy", owner="me", command=("true",),
                      image=None, env={}, cpu=1, memory_mb=512, gpu=0, scratch_mb=0, max_runtime_s=60,
                      resource_class="toy", options=_Options(queue="q"))


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
    old = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]'
    assert old in text
    return text.replace(old, f'provider = "{provider}"\nresource_class = "cpu_small"\n'
                             f'command = ["{{python}}", "-m", "controlplane_tools.exercise"]\nprovider_options = {{ {options} }}')


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


def test_a_class_promising_scratch_disk_its_provider_cannot_reserve_is_refused_at_load() -> None:
    """A resource class's scratch_mb caps what its tasks may ask for; on a provider that can never
    reserve scratch disk it would promise what no job gets, so the catalog does not load."""
    text = default_catalog_text().replace("[resource_classes.cpu_small]\n", "[resource_classes.cpu_small]\nscratch_mb = 4096\n")
    with pytest.raises(CatalogError) as refused:
        Catalog.parse(text, source="cat.toml")
    assert refused.value.problems == tuple(  # one for each of the class's tools, all at once
        f"cat.toml: resource_classes.cpu_small.scratch_mb: tool '{tool}' runs on the local provider, which cannot "
        "reserve scratch disk for a job; remove scratch_mb" for tool in ("lj_relax", "exercise"))
    # A provider that declares it can guarantee scratch disk for some shapes takes the cap.
    text = _catalog("aws_batch", 'job_queue = "q", job_definition = "d"').replace(
        'provider = "local"\nresource_class = "cpu_small"', 'provider = "local"\nresource_class = "cpu_standard"')
    text = text.replace("[resource_classes.cpu_small]\n", "[resource_classes.cpu_small]\nscratch_mb = 4096\n")
    assert Catalog.parse(text, source="cat.toml").resource_classes["cpu_small"].scratch_mb == 4096
    assert Catalog.parse(default_catalog_text()).resource_classes["cpu_small"].scratch_mb is None
