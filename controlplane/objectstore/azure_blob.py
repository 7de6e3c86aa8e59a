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

import base64
import builtins
import datetime
import os
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobBlock, BlobSasPermissions, BlobServiceClient, ContentSettings, generate_blob_sas

from controlplane.objectstore.base import (
    CHUNK,
    HashingReader,
    ObjectExists,
    ObjectInfo,
    ObjectStore,
    SignedRequest,
    UploadIncomplete,
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
    """A body arriving as an iterator of blocks, as a plain binary stream (read(n), context
    manager) that holds at most one block beyond what the caller asked for."""

    def __init__(self, blocks: Iterator[bytes]):
        self._blocks = blocks
        self._left = b""

    def read(self, n: int = -1) -> bytes:
        out = [self._left]
        have = len(self._left)
        while n < 0 or have < n:
            block = next(self._blocks, b"")
            if not block:
                break
            out.append(block)
            have += len(block)
        data = b"".join(out)
        if n < 0 or len(data) <= n:
            self._left = b""
            return data
        self._left = data[n:]
        return data[:n]

    def close(self) -> None:
        close = getattr(self._blocks, "close", None)
        if close is not None:
            close()

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
        """One GET whose body is read as the caller reads: the SDK's downloader holds its first
        32 MiB, then a 4 MiB chunk at a time, and copies of them."""
        blob = self.container_client.get_blob_client(self._name(key))
        try:
            blocks = blob._client.blob.download()  # the generated operation: the body streamed
        except ResourceNotFoundError:
            raise FileNotFoundError(key) from None
        return _Reader(blocks)  # type: ignore[return-value]

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

    # ---- uploads a caller sends (`controlplane.service.uploads`) ------------------------------
    def upload_plan(self, key: str, *, size_bytes: int, content_type: str, expires_in: int,
                    session: str | None, single_max: int) -> tuple[dict[str, Any], str | None]:
        """One Put Blob up to `single_max`; past it a block blob: a SAS allowing Put Block, a URL
        per block still missing (the blob's uncommitted blocks say which are there), and the
        control plane commits the block list when the upload completes."""
        if size_bytes <= single_max:
            put = self.signed_put(key, expires_in=expires_in)
            return {"form": "single", **put.as_dict(),
                    "headers": {**put.headers, "x-ms-blob-content-type": content_type}}, None
        from controlplane.objectstore.s3 import multipart_part_size

        url = self._sas_url(key, expires_in, BlobSasPermissions(write=True))
        block = multipart_part_size(size_bytes, single_max)
        count = -(-size_bytes // block)
        held = {b.id: b.size for b in self._uncommitted(key)}
        parts, done = [], []
        for n in range(1, count + 1):
            if held.get(block_id(n)) == min(block, size_bytes - (n - 1) * block):
                done.append(n)
                continue
            wire = base64.b64encode(block_id(n).encode()).decode()
            parts.append({"part_number": n, "block_id": wire, "url": f"{url}&comp=block&blockid={quote(wire)}"})
        return {"form": "azure_blocks", "method": "PUT", "part_size": block, "part_count": count, "parts": parts,
                "parts_done": done, "block_ids": "base64 of the part number as 8 decimal digits"}, None

    def _uncommitted(self, key: str) -> builtins.list[Any]:  # (`list` is a method here)
        try:
            _committed, uncommitted = self.container_client.get_blob_client(self._name(key)).get_block_list("uncommitted")
        except ResourceNotFoundError:
            return []
        return list(uncommitted)

    def finish_upload(self, key: str, session: str | None, size_bytes: int, content_type: str) -> None:
        """Commits the uploaded blocks in order when they are all there; UploadIncomplete if
        not. A single Put Blob needs nothing."""
        if self.stat(key) is not None:
            return
        blocks = {b.id: b.size for b in self._uncommitted(key)}
        ids, total, n = [], 0, 1
        while block_id(n) in blocks:
            ids.append(block_id(n))
            total += blocks[block_id(n)]
            n += 1
        if not ids or total != size_bytes:
            raise UploadIncomplete(key)
        self.container_client.get_blob_client(self._name(key)).commit_block_list(
            [BlobBlock(block_id=i) for i in ids], content_settings=ContentSettings(content_type=content_type),
            if_none_match="*")

    def abort_upload(self, key: str, session: str | None) -> None:
        """Uncommitted blocks cannot be deleted by themselves: Azure drops them a week after
        their last change, which an upload's expiry matches."""

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


def block_id(n: int) -> str:
    """The id of an upload's block `n` (from 1), as the SDK lists and commits it (it encodes it
    in base64 on the wire): the same length for every block, as Azure wants."""
    return f"{n:08d}"
