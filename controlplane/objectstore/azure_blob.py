"""Azure Blob Storage through azure-storage-blob: `az://account/container/prefix`.

The endpoint is `https://<account>.blob.core.windows.net`, or `AZURE_STORAGE_BLOB_ENDPOINT`
(an emulator such as azurite: `http://127.0.0.1:10000/devstoreaccount1`). The credential is the
account key in `AZURE_STORAGE_KEY` (development), otherwise azure-identity's
DefaultAzureCredential (the job's managed identity in production).

Writes stream as 8 MiB blocks with `If-None-Match: *` (a second write of a name is refused by
the service). Links are SAS URLs for reading one blob (or, for jobs that hold no credentials, for
creating one): signed with the account key in
development, with a user-delegation key in production (requested from the service with the
identity's token and cached until shortly before it expires; at most 7 days).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobSasPermissions, BlobServiceClient, ContentSettings, generate_blob_sas

from controlplane.objectstore.base import (
    CHUNK,
    HashingReader,
    ObjectExists,
    ObjectInfo,
    ObjectStore,
    SignedRequest,
    check_key,
    content_disposition,
    join_key,
    split_store_url,
)

BLOCK = 8 * CHUNK
KEY_SKEW = datetime.timedelta(minutes=10)  # user-delegation keys end this much short of Azure's 7-day limit
KEY_REUSE_SLACK = datetime.timedelta(hours=1)  # a 7-day link may be this much shorter to reuse the cached key
UTC = datetime.UTC


class _Reader:
    """A downloader as a plain binary stream (read(n), context manager)."""

    def __init__(self, downloader: Any):
        self._d = downloader

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._d.read(n)
        return data

    def close(self) -> None:
        pass

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AzureBlobObjectStore(ObjectStore):
    signs_uploads = True

    def __init__(self, account: str, container: str, prefix: str = "", *, endpoint: str | None = None,
                 account_key: str | None = None, credential: Any = None):
        self.account = account
        self.container = container
        self.prefix = prefix
        self.url = f"az://{account}/{container}/{prefix}".rstrip("/")
        self.endpoint = (endpoint or os.environ.get("AZURE_STORAGE_BLOB_ENDPOINT")
                         or f"https://{account}.blob.core.windows.net").rstrip("/")
        self.account_key = account_key or os.environ.get("AZURE_STORAGE_KEY")
        if credential is None:
            if self.account_key:
                credential = {"account_name": account, "account_key": self.account_key}
            else:
                from azure.identity import DefaultAzureCredential

                credential = DefaultAzureCredential()
        self.service = BlobServiceClient(self.endpoint, credential=credential, max_single_put_size=BLOCK,
                                         max_block_size=BLOCK)
        self.container_client = self.service.get_container_client(container)
        self._delegation: tuple[Any, datetime.datetime] | None = None

    @classmethod
    def from_url(cls, url: str) -> AzureBlobObjectStore:
        _, account, rest = split_store_url(url)
        container, _, prefix = rest.partition("/")
        if not container:
            raise ValueError(f"'{url}': expected az://account/container[/prefix]")
        return cls(account, container, prefix)

    def _name(self, key: str) -> str:
        return join_key(self.prefix, key)

    # ---- writes -------------------------------------------------------------------------------
    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str | None = None,
                   overwrite: bool = False) -> ObjectInfo:
        reader = HashingReader(stream)
        try:
            # the SDK reads any object with read(n); its annotation names only str streams
            self.container_client.upload_blob(
                self._name(key), reader, overwrite=overwrite, max_concurrency=1,  # type: ignore[arg-type]
                content_settings=ContentSettings(content_type=content_type or "application/octet-stream"))
        except ResourceExistsError:
            raise ObjectExists(key) from None
        return ObjectInfo(key=key, size_bytes=reader.size, sha256=reader.sha.hexdigest(), content_type=content_type)

    # ---- reads --------------------------------------------------------------------------------
    def open(self, key: str) -> BinaryIO:
        try:
            return _Reader(self.container_client.download_blob(self._name(key)))  # type: ignore[return-value]
        except ResourceNotFoundError:
            raise FileNotFoundError(key) from None

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            props = self.container_client.get_blob_client(self._name(key)).get_blob_properties()
        except ResourceNotFoundError:
            return None
        return ObjectInfo(key=key, size_bytes=int(props.size), content_type=props.content_settings.content_type)

    def list(self, prefix: str) -> Iterator[str]:
        full = self._name(prefix.rstrip("/")) + "/" if prefix.strip("/") else (f"{self.prefix}/" if self.prefix else "")
        cut = len(self.prefix) + 1 if self.prefix else 0
        return iter(sorted(b[cut:] for b in self.container_client.list_blob_names(name_starts_with=full)))

    def delete_prefix(self, prefix: str) -> int:
        n = 0
        for key in list(self.list(prefix)):
            try:
                self.container_client.delete_blob(self._name(key))
                n += 1
            except ResourceNotFoundError:
                pass  # deleted already: deletion is idempotent
        return n

    # ---- links --------------------------------------------------------------------------------
    def signed_url(self, key: str, *, expires_in: int, filename: str) -> str:
        return self._sas_url(key, expires_in, BlobSasPermissions(read=True),
                             content_disposition=content_disposition(filename))

    def signed_put(self, key: str, *, expires_in: int) -> SignedRequest:
        """A SAS for creating this one blob (Put Blob, single request: up to 5000 MiB); the upload
        says `If-None-Match: *`, so the service refuses a second one."""
        url = self._sas_url(key, expires_in, BlobSasPermissions(create=True, write=True))
        return SignedRequest("PUT", url, {"x-ms-blob-type": "BlockBlob", "If-None-Match": "*"})

    def _sas_url(self, key: str, expires_in: int, permission: BlobSasPermissions, **extra: Any) -> str:
        check_key(key)
        now = datetime.datetime.now(UTC)
        expiry = now + datetime.timedelta(seconds=min(int(expires_in), self.max_url_ttl_s))
        name = self._name(key)
        common = dict(account_name=self.account, container_name=self.container, blob_name=name,
                      permission=permission, expiry=expiry,
                      start=now - datetime.timedelta(minutes=5),  # tolerate clock skew
                      **extra)
        if self.account_key:
            sas = generate_blob_sas(account_key=self.account_key, **common)
        else:
            delegation, key_until = self._delegation_key(expiry)
            common["expiry"] = min(expiry, key_until)  # a link cannot outlive the key that signs it
            sas = generate_blob_sas(user_delegation_key=delegation, **common)
        return f"{self.endpoint}/{self.container}/{quote(name)}?{sas}"

    def _delegation_key(self, needed_until: datetime.datetime) -> tuple[Any, datetime.datetime]:
        """A user-delegation key valid until `needed_until` if it can be (the cached one, or a new
        one), and its expiry. Azure refuses a key that ends more than 7 days after *its* clock, so
        a new key asks for 10 minutes less than that (a host clock a little fast is no error); and
        a key with at least 7 days less an hour left serves the longest links, which may then end
        up to an hour early, rather than every 7-day link fetching a key of its own."""
        now = datetime.datetime.now(UTC)
        longest = now + datetime.timedelta(days=7) - KEY_SKEW
        if self._delegation is None or self._delegation[1] < min(needed_until, longest - KEY_REUSE_SLACK):
            until = longest
            key = self.service.get_user_delegation_key(now - datetime.timedelta(minutes=5), until)
            self._delegation = (key, until)
        return self._delegation
