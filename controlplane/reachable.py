"""The data rule: a task's inputs and results must be reachable from wherever its attempt runs.

A job reads its inputs and writes its events, result and artifacts in its tool's object store.
With `CONTROLPLANE_JOB_STORE_ACCESS=grants` it does so through links the control plane signs, so
any signing store works from any placement. Otherwise it uses the identity it runs as, which
reaches its own cloud's stores (`Provider.own_stores`: Cloud Run gs://, AWS Batch s3://,
Container Apps az://; a local job any store the control plane can open) and whatever else the
operator granted it, declared on the placement as `reachable_stores` (URLs or their prefixes).
A placement that reaches none of these is refused at catalog load, naming the placement and the
store, rather than failing each of its attempts.
"""

from __future__ import annotations

from controlplane.catalog import Catalog, Placed
from controlplane.objectstore.base import split_store_url
from controlplane_providers import registry


def reaches(placed: Placed, store_url: str) -> bool:
    """Whether a job at `placed` reaches `store_url` by its own identity."""
    try:
        own = registry.provider_class(placed.provider).own_stores
    except registry.ProviderUnavailable:
        return True  # (refused at load for that already)
    if own is None:
        return True
    return any(_under(store_url, p) for p in (*own, *placed.reachable_stores))


def _under(store_url: str, declared: str) -> bool:
    """`store_url` is `declared` (a scheme, "s3://"; a store; or a store and prefix) or below it."""
    if declared.endswith("://"):
        return store_url.startswith(declared)
    return store_url.rstrip("/") == declared.rstrip("/") or store_url.startswith(declared.rstrip("/") + "/")


def problems(catalog: Catalog, *, job_store_access: str, default_store: str) -> list[str]:
    """Every placement of the catalog's tools that cannot reach its tool's object store (none
    when jobs reach stores through signed grants), each naming the tool, the placement and the store."""
    if job_store_access == "grants":
        return []
    found = []
    for name, tool in catalog.tools.items():
        rc = catalog.resource_classes.get(tool.resource_class)
        store = tool.object_store or (rc.object_store if rc is not None else None) or default_store
        for i, placed in enumerate(catalog.placements(name)):
            if reaches(placed, store):
                continue
            where = f"tools.{name}.placements.{i}" if tool.placements else f"tools.{name}"
            own = registry.provider_class(placed.provider).own_stores or ()
            found.append(f"{catalog.source}: {where}: {placed.provider} jobs cannot reach the tool's object store "
                         f"{_named(store)} by their own identity (they reach {', '.join(own)}); set "
                         "CONTROLPLANE_JOB_STORE_ACCESS=grants, or list the store in the placement's reachable_stores")
    return found


def _named(store_url: str) -> str:
    """A store as an error names it: its URL, but never a local directory's path."""
    scheme, _, _ = split_store_url(store_url)
    return "file:// (a directory of the control plane's)" if scheme == "file" else store_url
