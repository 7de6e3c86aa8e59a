"""What a catalog needs before a server takes it: its problems against the server's settings
found, the object stores it names opened, and the providers it names created."""

from __future__ import annotations

from typing import Any

from controlplane import reachable
from controlplane.catalog import Catalog, CatalogError, file_format, parse_data, server_problems
from controlplane.objectstore.registry import ObjectStores
from controlplane.settings import Settings
from controlplane_providers import registry
from controlplane_providers.base import Provider, ProviderContext


def open_for(catalog: Catalog, settings: Settings, object_stores: ObjectStores,
             providers: dict[str, Provider[Any]]) -> dict[str, Provider[Any]]:
    """Check `catalog` against the server's settings, open the object stores it names and
    create the providers it names that are not in `providers` yet (returned). CatalogError otherwise."""
    problems = server_problems(catalog, max_ttl_s=settings.max_ttl_s) + reachable.problems(
        catalog, job_store_access=settings.job_store_access, default_store=settings.resolved_object_store_url)
    if problems:
        raise CatalogError(*problems)
    for url in catalog.store_urls():  # open every store the catalog names, failing early
        object_stores.get(url)
    if settings.job_store_access == "grants":
        for url in [settings.resolved_object_store_url, *catalog.store_urls()]:
            if not object_stores.get(url).signs_uploads:
                raise CatalogError(f"CONTROLPLANE_JOB_STORE_ACCESS=grants needs object stores that sign "
                                   f"uploads (s3://, gs://, az://); {url.split('://', 1)[0]}:// does not")
    context = ProviderContext(home=settings.home, kill_grace_s=settings.kill_grace_s,
                              endpoint_file=settings.endpoint_file)
    opened: dict[str, Provider[Any]] = {}
    for name in catalog.providers():
        if name not in providers:
            try:
                opened[name] = registry.create(name, context)
            except registry.ProviderUnavailable as e:
                raise CatalogError(f"{catalog.source}: {e}") from None
    return opened


def prepare(text: str, settings: Settings, object_stores: ObjectStores,
            providers: dict[str, Provider[Any]]) -> tuple[Catalog, dict[str, Provider[Any]]]:
    """The catalog file's new text, validated as at start, with the providers it adds (blocks:
    run it in a worker thread). CatalogError, without internals, when it cannot be taken."""
    path = settings.resolved_catalog_path
    new = Catalog.from_data(parse_data(text, source=str(path), fmt=file_format(path)), source=str(path))
    try:
        return new, open_for(new, settings, object_stores, providers)
    except CatalogError:
        raise
    except Exception as e:  # noqa: BLE001 - an object store that cannot be opened, said without internals
        raise CatalogError(f"{path}: an object store it names cannot be opened ({type(e).__name__})") from None
