"""The object stores a control plane uses (`ObjectStores`; the database is `Store`), opened once
each: the default one and those the catalog names. Local stores get a link signer; their links
are served by the control plane."""

from __future__ import annotations

from controlplane.objectstore.base import ObjectStore, open_store
from controlplane.objectstore.local import LinkSigner, LocalObjectStore, store_id


class ObjectStores:
    def __init__(self, default_url: str, secret_key: bytes):
        self.default_url = default_url
        self._secret = secret_key
        self._stores: dict[str, ObjectStore] = {}
        self._local_by_id: dict[str, LocalObjectStore] = {}
        self.base_url: str | None = None
        self.default = self.get(default_url)

    def get(self, url: str | None) -> ObjectStore:
        """The store a task or artifact recorded ('' or None: the default store)."""
        url = url or self.default_url
        store = self._stores.get(url)
        if store is None:
            store = open_store(url)
            if isinstance(store, LocalObjectStore):
                sid = store_id(store.url)
                store.signer = LinkSigner(self._secret, sid, self.base_url)
                self._local_by_id[sid] = store
            self._stores[url] = store
        return store

    def local(self, sid: str) -> LocalObjectStore | None:
        return self._local_by_id.get(sid)

    def set_base_url(self, url: str) -> None:
        """Where the control plane serves local-store links (known once it listens)."""
        self.base_url = url
        for store in self._local_by_id.values():
            assert store.signer is not None
            store.signer.base_url = url
