"""Object stores: where task inputs, results, fallback events and artifacts live.

Imported by the control plane *and* by the in-job runner, so these modules use only the
standard library (a cloud backend imports its SDK inside its own module). `open_store(url)`
picks the backend from the URL scheme.
"""

from controlplane.objectstore.base import ObjectExists, ObjectInfo, ObjectStore, UnsafeKey, open_store

__all__ = ["ObjectExists", "ObjectInfo", "ObjectStore", "UnsafeKey", "open_store"]
