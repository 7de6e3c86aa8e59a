"""Amazon S3 (and S3-compatible stores) through boto3: `s3://bucket/prefix`.

Credentials, region and endpoint come from boto3's standard chain (the job's IAM role in
Batch, `AWS_ENDPOINT_URL_S3` for an emulator). Writes stream: objects up to one part go in one
PutObject, larger ones as a multipart upload of 8 MiB parts, hashing as they go, so a file of
several GiB never sits in memory. Immutability is enforced by S3 itself (`If-None-Match: *`
on PutObject and CompleteMultipartUpload). Links are SigV4 presigned GETs (and, for jobs that hold
no credentials, presigned PUTs), at most 7 days: they stop working early when the credentials that
signed them (an STS session, such as an ECS task role's, rotated every few hours) expire.
"""

from __future__ import annotations

import builtins
import hashlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from controlplane.objectstore.base import (
    CHUNK,
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

PART = 8 * CHUNK  # 8 MiB: above S3's 5 MiB minimum part, 1250 parts for a 10 GiB file


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


class S3ObjectStore(ObjectStore):
    signs_uploads = True

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None):
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        path_style = bool(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
        self.client = client or boto3.client("s3", config=Config(
            signature_version="s3v4",
            retries={"mode": "adaptive", "max_attempts": 8},
            s3={"addressing_style": "path" if path_style else "auto"},
        ))

    @classmethod
    def from_url(cls, url: str) -> S3ObjectStore:
        _, bucket, prefix = split_store_url(url)
        return cls(bucket, prefix)

    def _key(self, key: str) -> str:
        return join_key(self.prefix, key)

    # ---- writes -------------------------------------------------------------------------------
    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str | None = None,
                   overwrite: bool = False) -> ObjectInfo:
        full = self._key(key)
        extra: dict[str, Any] = {"ContentType": content_type or "application/octet-stream"}
        cond: dict[str, Any] = {} if overwrite else {"IfNoneMatch": "*"}
        sha = hashlib.sha256()
        first = _read_full(stream, PART)
        sha.update(first)
        if len(first) < PART:  # the whole object fits in one request
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=first, **extra, **cond)
            except ClientError as e:
                if _code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
                    raise ObjectExists(key) from None
                raise
            return ObjectInfo(key=key, size_bytes=len(first), sha256=sha.hexdigest(), content_type=content_type)

        if not overwrite and self.stat(key) is not None:
            raise ObjectExists(key)  # fail before uploading GiBs; S3 re-checks at completion
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=full, **extra)["UploadId"]
        parts: list[dict[str, Any]] = []
        size = 0
        try:
            chunk = first
            while chunk:
                resp = self.client.upload_part(Bucket=self.bucket, Key=full, UploadId=upload,
                                               PartNumber=len(parts) + 1, Body=chunk)
                parts.append({"ETag": resp["ETag"], "PartNumber": len(parts) + 1})
                size += len(chunk)
                chunk = _read_full(stream, PART)
                sha.update(chunk)
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload,
                                                  MultipartUpload={"Parts": parts}, **cond)
        except ClientError as e:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload)
            if _code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise ObjectExists(key) from None
            raise
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload)
            raise
        return ObjectInfo(key=key, size_bytes=size, sha256=sha.hexdigest(), content_type=content_type)

    # ---- reads --------------------------------------------------------------------------------
    def open(self, key: str) -> BinaryIO:
        try:
            body: BinaryIO = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            return body
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(key) from None
            raise

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        return ObjectInfo(key=key, size_bytes=int(head["ContentLength"]), content_type=head.get("ContentType"))

    def list(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix.rstrip("/")) + "/" if prefix.strip("/") else (f"{self.prefix}/" if self.prefix else "")
        cut = len(self.prefix) + 1 if self.prefix else 0
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
        for page in pages:
            for obj in page.get("Contents", []):
                yield obj["Key"][cut:]

    def delete_prefix(self, prefix: str) -> int:
        keys = [self._key(k) for k in self.list(prefix)]
        for i in range(0, len(keys), 1000):  # DeleteObjects takes 1000 keys a call
            resp = self.client.delete_objects(Bucket=self.bucket, Delete={
                "Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True})
            if resp.get("Errors"):
                first = resp["Errors"][0]
                raise OSError(f"S3 refused to delete {len(resp['Errors'])} objects: {first.get('Code')}")
        return len(keys)

    def signed_url(self, key: str, *, expires_in: int, filename: str) -> str:
        check_key(key)
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self._key(key),
                    "ResponseContentDisposition": content_disposition(filename)},
            ExpiresIn=min(int(expires_in), self.max_url_ttl_s),
        )
        return url

    def signed_put(self, key: str, *, expires_in: int) -> SignedRequest:
        """A presigned PutObject (single request: up to 5 GiB). `If-None-Match: *` makes S3 refuse
        a second upload of the key; it is an ordinary header, which the signature need not cover."""
        check_key(key)
        url = self.client.generate_presigned_url(
            "put_object", Params={"Bucket": self.bucket, "Key": self._key(key)},
            ExpiresIn=min(int(expires_in), self.max_url_ttl_s))
        return SignedRequest("PUT", url, {"If-None-Match": "*"})

    # ---- uploads a caller sends (`controlplane.service.uploads`) ------------------------------
    def upload_plan(self, key: str, *, size_bytes: int, content_type: str, expires_in: int,
                    session: str | None, single_max: int) -> tuple[dict[str, Any], str | None]:
        """One presigned PutObject up to `single_max`; past it a multipart upload the control
        plane starts (its id is the session), with a presigned UploadPart URL for each part the
        store does not hold yet (ListParts)."""
        check_key(key)
        full, ttl = self._key(key), min(int(expires_in), self.max_url_ttl_s)
        if size_bytes <= single_max:
            url = self.client.generate_presigned_url(
                "put_object", Params={"Bucket": self.bucket, "Key": full, "ContentType": content_type}, ExpiresIn=ttl)
            return {"form": "single", "method": "PUT", "url": url, "headers": {"Content-Type": content_type}}, None
        if session is None:
            session = self.client.create_multipart_upload(Bucket=self.bucket, Key=full,
                                                          ContentType=content_type)["UploadId"]
        part_size = multipart_part_size(size_bytes, single_max)
        count = -(-size_bytes // part_size)
        held = {p["PartNumber"]: p["Size"] for p in self._parts(full, session)}
        parts = []
        for n in range(1, count + 1):
            want = min(part_size, size_bytes - (n - 1) * part_size)
            if held.get(n) == want:
                continue
            url = self.client.generate_presigned_url(
                "upload_part", Params={"Bucket": self.bucket, "Key": full, "UploadId": session, "PartNumber": n},
                ExpiresIn=ttl)
            parts.append({"part_number": n, "url": url})
        return {"form": "s3_multipart", "method": "PUT", "multipart_id": session, "part_size": part_size,
                "part_count": count, "parts": parts, "parts_done": sorted(set(range(1, count + 1)) - {
                    p["part_number"] for p in parts})}, session

    def _parts(self, full: str, session: str) -> builtins.list[dict[str, Any]]:  # (`list` is a method here)
        out: builtins.list[dict[str, Any]] = []
        for page in self.client.get_paginator("list_parts").paginate(Bucket=self.bucket, Key=full, UploadId=session):
            out += page.get("Parts", [])
        return out

    def finish_upload(self, key: str, session: str | None, size_bytes: int, content_type: str) -> None:
        """Completes the multipart upload with the parts S3 lists (their ETags), if they are all
        there and add up to `size_bytes`; UploadIncomplete if not."""
        if session is None:
            if self.stat(key) is None:
                raise UploadIncomplete(key)
            return
        full = self._key(key)
        try:
            parts = sorted(self._parts(full, session), key=lambda p: p["PartNumber"])
        except ClientError as e:
            if _code(e) == "NoSuchUpload" and self.stat(key) is not None:
                return  # completed already (a retried complete_upload)
            raise
        numbers = [p["PartNumber"] for p in parts]
        if not parts or numbers != list(range(1, len(parts) + 1)) or sum(p["Size"] for p in parts) != size_bytes:
            raise UploadIncomplete(key)
        self.client.complete_multipart_upload(Bucket=self.bucket, Key=full, UploadId=session, MultipartUpload={
            "Parts": [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in parts]})

    def abort_upload(self, key: str, session: str | None) -> None:
        if session is None:
            return
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=session)
        except ClientError as e:
            if _code(e) not in ("NoSuchUpload", "404"):
                raise


def multipart_part_size(size_bytes: int, smallest: int) -> int:
    """Parts of `smallest` bytes, or larger (whole MiB) so that there are at most 1000 of them
    (S3 allows 10,000 parts of up to 5 GiB: a plan of a 5 TB file stays a thousand URLs)."""
    return max(smallest, -(-size_bytes // (1000 * CHUNK)) * CHUNK)


def _read_full(stream: BinaryIO, n: int) -> bytes:
    """Read exactly n bytes unless the stream ends first (pipes and sockets return short reads)."""
    buf = bytearray()
    while len(buf) < n:
        b = stream.read(n - len(buf))
        if not b:
            break
        buf += b
    return bytes(buf)
