"""Object storage for artifacts and uploaded files: a local directory or any S3-compatible store.

Keys are relative, slash-separated paths ("jobs/job_X/artifacts/model.safetensors"); a backend
maps them below its root (`file:///dir`) or prefix (`s3://bucket/prefix`). Writes are atomic
from a reader's point of view (local: temp file + rename; S3: a single PUT or multipart upload
that only appears on completion), so a half-written object is never visible under its key.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from domain.settings import Settings
from schemas.manifest import sha256_file

CHUNK_BYTES = 1 << 20
_KEY_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._-]+$")


def check_key(key: str) -> str:
    """Keys are relative paths of safe segments; '..', '.', empty and absolute paths are refused."""
    segments = key.split("/")
    if not key or any(s in ("", ".", "..") or not _KEY_SEGMENT_RE.match(s) for s in segments):
        raise ValueError(
            f"invalid storage key {key!r}: use '/'-separated names of letters, digits, '.', '_' and '-'"
        )
    return key


@dataclass(frozen=True)
class StoredObject:
    key: str
    size_bytes: int
    sha256: str


class LocalStorage:
    """A directory on a filesystem the API and the workers share."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / check_key(key)).resolve()
        if self.root not in path.parents:  # belt and braces: check_key already forbids escapes
            raise ValueError(f"storage key {key!r} escapes the storage root")
        return path

    def _write_atomically(self, key: str, source: BinaryIO) -> StoredObject:
        digest, size = hashlib.sha256(), 0

        def chunks() -> Iterator[bytes]:
            nonlocal size
            while chunk := source.read(CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
                yield chunk

        _write_chunks_atomically(self._path(key), chunks())
        return StoredObject(key, size, digest.hexdigest())

    def put_file(self, key: str, path: str | Path) -> StoredObject:
        with open(path, "rb") as source:
            return self._write_atomically(key, source)

    def put_bytes(self, key: str, data: bytes) -> StoredObject:
        import io

        return self._write_atomically(key, io.BytesIO(data))

    def get_file(self, key: str, path: str | Path) -> None:
        """Copy the object to `path`, which appears whole (temp file + rename)."""
        _write_chunks_atomically(Path(path), self.open_chunks(key))

    def list_keys(self, prefix: str) -> dict[str, int]:
        """{key: size} of every object below `prefix` (a key prefix ending at a '/')."""
        base = self._path(prefix.rstrip("/"))
        if not base.is_dir():
            return {}
        return {path.relative_to(self.root).as_posix(): path.stat().st_size for path in base.rglob("*")
                if path.is_file() and not path.name.startswith(".partial-")}

    def open_chunks(self, key: str) -> Iterator[bytes]:
        with self._path(key).open("rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                yield chunk

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def presigned_url(self, key: str, *, filename: str | None = None) -> str | None:
        return None  # served through the API instead

    def ping(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise OSError(f"storage root {self.root} is not writable")


REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class StorageRedirected(Exception):
    """An S3 endpoint of ours or an organisation's answered a redirect. Refused on the first hop: botocore would
    retry the same endpoint under another signing region, asking the bucket's region by a HEAD that is redirected
    again, until RecursionError; and a redirect is no way for an endpoint to send our requests elsewhere. The
    message names the endpoint, the setting that names it and the fix; a job fails with `storage_error`."""


def _refuse_redirects(client: Any, endpoint_url: str, endpoint_setting: str) -> None:
    """Make every redirect answer of `client`'s endpoint a StorageRedirected, before botocore's own handlers
    (its region redirector among them) see it. A 304 (not modified) is no redirect and passes."""

    def refuse(response: Any = None, operation: Any = None, **_kwargs: Any) -> None:
        http = response[0] if response else None
        if http is None or http.status_code not in REDIRECT_STATUSES:
            return
        location = str(http.headers.get("location") or "")[:200]
        raise StorageRedirected(
            f"object storage at {endpoint_url} answered {getattr(operation, 'name', 'a request')} with a redirect "
            f"({http.status_code}{' to ' + location if location else ''}); redirects are not followed: set "
            f"{endpoint_setting} to the address that serves the bucket itself")

    client.meta.events.register_first("needs-retry.s3", refuse)


def s3_client(settings: Settings, *, anonymous: bool = False) -> Any:
    """A boto3 S3 client for the deployment's endpoint and credentials (its storage, trusted buckets), or unsigned
    on that endpoint (`anonymous`: public buckets only, and no credential from the environment either). An
    organisation's own credentials: `organisation_s3_client`. Which one a URI gets: domain/storage_scope.py."""
    setting = "DRAFTSMITH_S3_ENDPOINT_URL (the deployment's storage endpoint)"
    if anonymous:
        return _client(settings.s3_endpoint_url, settings.s3_region, None, anonymous=True, endpoint_setting=setting)
    credentials = None
    if settings.s3_access_key_id and settings.s3_secret_access_key:
        credentials = (settings.s3_access_key_id, settings.s3_secret_access_key.get_secret_value())
    return _client(settings.s3_endpoint_url, settings.s3_region, credentials, endpoint_setting=setting)


def organisation_s3_client(settings: Settings, *, access_key_id: str, secret_access_key: str,
                           endpoint_url: str | None, region: str | None,
                           endpoint_setting: str = "the endpoint_url of your S3 secret") -> Any:
    """A client with an organisation's own credentials, for the endpoint its secret names (AWS when it names none:
    never the deployment's own endpoint). Every connection it opens goes through the egress policy, to the
    address that policy checked (domain/egress.py): a secret's endpoint that resolves, now or after a DNS change,
    to our storage, database or private networks is refused at connect. A redirect from that endpoint is refused
    (StorageRedirected, naming `endpoint_setting`: which secret's field to fix)."""
    from domain.egress import EgressPolicy

    client = _client(endpoint_url, region or settings.s3_region, (access_key_id, secret_access_key),
                     endpoint_setting=endpoint_setting)
    _pin_connections(client, EgressPolicy.from_settings(settings))
    return client


def _client(endpoint_url: str | None, region: str, credentials: tuple[str, str] | None, *, endpoint_setting: str,
            anonymous: bool = False) -> Any:
    """A boto3 S3 client. A custom endpoint's redirects are refused (`_refuse_redirects`); AWS's own (no endpoint)
    keep botocore's region redirect, which only ever goes to the bucket's regional AWS endpoint."""
    import boto3  # imported here: a local-storage deployment never pays for botocore
    from botocore import UNSIGNED
    from botocore.config import Config

    keys = {"aws_access_key_id": credentials[0], "aws_secret_access_key": credentials[1]} if credentials else {}
    client = boto3.client(
        "s3", endpoint_url=endpoint_url, region_name=region,
        config=Config(signature_version=UNSIGNED if anonymous else "s3v4",
                      retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60),
        **keys,
    )
    if endpoint_url is not None:
        _refuse_redirects(client, endpoint_url, endpoint_setting)
    return client


def _pin_connections(client: Any, policy: Any) -> None:
    """Swap the connection classes of `client`'s HTTP session for ones that ask `policy` for the address of every new
    connection (a redirect, a retry, a proxy included) and connect to exactly it; TLS still verifies the URL's
    host name. botocore keeps its pool classes in one attribute, read when a pool (or a proxy's pool) is made."""
    import socket

    import botocore.awsrequest
    from urllib3.exceptions import NewConnectionError
    from urllib3.util import connection

    def pinned(pool_class: type) -> type:
        class PinnedConnection(pool_class.ConnectionCls):  # type: ignore[name-defined,misc]
            def _new_conn(self) -> socket.socket:  # urllib3's own signature
                address = policy.connect_address(self._dns_host, self.port)
                try:
                    return connection.create_connection((address, self.port), self.timeout,
                                                        source_address=self.source_address,
                                                        socket_options=self.socket_options)
                except OSError as exc:
                    raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc

        return type(f"Pinned{pool_class.__name__}", (pool_class,), {"ConnectionCls": PinnedConnection})

    session = client._endpoint.http_session
    classes = {"http": pinned(botocore.awsrequest.AWSHTTPConnectionPool),
               "https": pinned(botocore.awsrequest.AWSHTTPSConnectionPool)}
    session._pool_classes_by_scheme = classes
    session._manager.pool_classes_by_scheme = classes
    for manager in session._proxy_managers.values():
        manager.pool_classes_by_scheme = classes


class S3Storage:
    """An S3 bucket/prefix; any S3-compatible endpoint via settings.s3_endpoint_url."""

    def __init__(self, bucket: str, prefix: str, settings: Settings) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.ttl = settings.presigned_url_ttl_seconds
        self.client = s3_client(settings)

    def _object_key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, key: str, path: str | Path) -> StoredObject:
        path = Path(path)
        sha256 = sha256_file(path)
        # upload_file switches to multipart for big files; the object appears only when complete.
        self.client.upload_file(str(path), self.bucket, self._object_key(key), ExtraArgs={"Metadata": {"sha256": sha256}})
        return StoredObject(key, path.stat().st_size, sha256)

    def put_bytes(self, key: str, data: bytes) -> StoredObject:
        sha256 = hashlib.sha256(data).hexdigest()
        self.client.put_object(Bucket=self.bucket, Key=self._object_key(key), Body=data, Metadata={"sha256": sha256})
        return StoredObject(key, len(data), sha256)

    def get_file(self, key: str, path: str | Path) -> None:
        _write_chunks_atomically(Path(path), self.open_chunks(key))

    def list_keys(self, prefix: str) -> dict[str, int]:
        root = self._object_key(prefix.rstrip("/")) + "/"
        found: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root):
            for item in page.get("Contents", []):
                key = item["Key"][len(self.prefix) + 1:] if self.prefix else item["Key"]
                found[key] = item["Size"]
        return found

    def open_chunks(self, key: str) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self._object_key(key))["Body"]
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._object_key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._object_key(key))

    def presigned_url(self, key: str, *, filename: str | None = None) -> str | None:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._object_key(key)}
        if filename:
            params["ResponseContentDisposition"] = f'attachment; filename="{filename}"'
        url: str = self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=self.ttl)  # boto3: untyped
        return url

    def ping(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)


def _write_chunks_atomically(path: Path, chunks: Iterator[bytes]) -> None:
    """The domain's one write-then-rename (stored objects, and copies of them fetched to a local path), under
    trainer/atomic.py's fsync policy: the file is fsynced before the rename, its directory after. It is not that
    helper because the domain may not import the trainer (tests/test_layout.py lists this file as the one other
    place allowed to rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    except OSError as exc:  # EINVAL: a filesystem that cannot fsync a directory, as trainer/atomic.py lets be
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(directory)


def storage_from_settings(settings: Settings) -> LocalStorage | S3Storage:
    parts = urlsplit(settings.storage_url)
    if parts.scheme == "file":
        return LocalStorage(unquote(parts.path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError("storage_url s3://bucket/prefix needs a bucket")
        return S3Storage(parts.netloc, parts.path, settings)
    raise ValueError(f"unsupported storage_url scheme {parts.scheme!r}; use file:/// or s3://")
