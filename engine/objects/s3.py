"""`S3ObjectStore`: the object store port over an S3-compatible service.

Why pyarrow's S3 client and not boto3: pyarrow is already the engine's dependency, and its
`S3FileSystem.open_input_file` is a random-access file that `pyarrow.parquet` reads directly
(the footer, then one row group's column chunks by range GETs), which is what `open_input`
must give. Everything the port needs maps onto it: PutObject (single part below pyarrow's
part size, multipart above: either way the object appears whole on completion, never in
part), GetObject with a range, HeadObject, ListObjectsV2, DeleteObject. This module is the
only one that imports `pyarrow.fs.S3FileSystem` (shared/STYLE.md: each effectful library in
one module).

Retries: the AWS SDK's default strategy, `S3_ATTEMPTS_MAX` attempts of each request for the
errors the SDK deems retryable (connection refused or reset, timeouts, 5xx, throttling), with
exponential backoff (limits.py says how long). Then the error is typed (`typed_error`):

* network errors, timeouts, 5xx, SlowDown/throttling: `ObjectStoreUnavailable`;
* a missing key: `ObjectNotFound`; a missing bucket: `ObjectStoreFailed` (checked with a
  HeadBucket on the not-found path only, as pyarrow reports both as "path does not exist");
* access denied, bad credentials, and everything unrecognised: `ObjectStoreFailed`.

pyarrow reports an AWS error as an `OSError` whose text carries "AWS Error <NAME>"; the names
are the SDK's `CoreErrors`/`S3Errors`. Reading them from the text is the only way pyarrow
offers; an unrecognised text is permanent (the safe side: the engine stops flushing and says
so, rather than retrying something that will never work).

Immutability: a put first asks for the object (HeadObject); if it exists with the same bytes
the put is a no-op, with other bytes `ObjectExists`. Two writers racing on one name are not
detected (S3's conditional `If-None-Match` put is not reachable through pyarrow); the engine
names objects uniquely, so only a retried put of identical bytes ever meets an existing name.

A put interrupted (connection cut, server killed) leaves no object under its name; a
multipart upload interrupted may leave its parts on the server until a lifecycle rule
aborts incomplete uploads (configure one on a real bucket).

Streamed writes (`put_stream`, issue 23: the Spark jobs' outputs, whatever their size) go up
a part at a time through a second client with pyarrow's background writes off: pyarrow's S3
stream buffers `S3_PART_BYTES` (its 10 MiB part size) and, with background writes on, hands
each full part to its I/O pool with a copy and no cap on the parts in flight, so a writer
faster than the network would grow without bound; off, each part is sent before the next is
buffered. pyarrow offers no abort from Python (its stream completes the upload even when
closed after an error), so a failed streamed write deletes the object it completed.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyarrow.fs import S3FileSystem

from engine.objects import limits
from engine.objects.errors import (
    BadObjectName,
    ObjectExists,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreFailed,
    ObjectStoreUnavailable,
)
from engine.objects.store import ObjectInfo, check_name, check_prefix, check_range, check_size

_TRANSIENT_AWS_ERRORS = frozenset(
    {
        "NETWORK_CONNECTION",
        "REQUEST_TIMEOUT",
        "SERVICE_UNAVAILABLE",
        "INTERNAL_FAILURE",
        "SLOW_DOWN",
        "THROTTLING",
        "REQUEST_LIMIT_EXCEEDED",
        "REQUEST_TIMEOUT_EXCEPTION",
    }
)
_NOT_FOUND_AWS_ERRORS = frozenset({"NO_SUCH_KEY", "RESOURCE_NOT_FOUND"})
_AWS_ERROR = re.compile(r"AWS Error ([A-Z_]+)")
_HTTP_5XX = re.compile(r"(?:code|status)\D{0,4}(5\d\d)\b", re.IGNORECASE)
_CURL_ERROR = re.compile(r"curlCode: (\d+)")
_TRANSIENT_CURL_CODES = frozenset({6, 7, 18, 28, 52, 55, 56})
"""curl's couldn't resolve, couldn't connect, partial file, timeout, empty reply, send and
receive errors: the network, not the request."""
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_ENDPOINT = re.compile(r"[A-Za-z0-9.-]+(:\d{1,5})?\Z|\[[0-9A-Fa-f:]+\](:\d{1,5})?\Z")


class S3ObjectStore:
    """The port over bucket `bucket`, objects under key prefix `prefix` ("" for the bucket's
    root). `endpoint` is "host:port" (an S3-compatible server; for AWS itself,
    "s3.<region>.amazonaws.com" with scheme "https")."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        prefix: str,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        scheme: str = "http",
        *,
        connect_timeout_s: float = limits.S3_CONNECT_TIMEOUT_S,
        request_timeout_s: float = limits.S3_REQUEST_TIMEOUT_S,
        attempts_max: int = limits.S3_ATTEMPTS_MAX,
    ) -> None:
        prefix = prefix.strip("/")
        self.description = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        if not _BUCKET.match(bucket):
            raise ObjectStoreFailed(self.description, "", f"bad bucket name {bucket!r}")
        if prefix:
            if len(prefix) > limits.S3_PREFIX_BYTES_MAX:
                raise BadObjectName(self.description, "", "prefix longer than s3_prefix_bytes_max")
            check_name(self.description, prefix)
        if not _ENDPOINT.match(endpoint):
            raise ObjectStoreFailed(self.description, "", f"bad endpoint {endpoint!r} (host:port)")
        assert scheme in ("http", "https")
        assert 1 <= attempts_max <= 100
        self.bucket = bucket
        self.prefix = prefix
        self._base = f"{bucket}/{prefix}" if prefix else bucket
        self._options: dict[str, Any] = {
            "access_key": access_key,
            "secret_key": secret_key,
            "region": region,
            "scheme": scheme,
            "endpoint_override": endpoint,
            "connect_timeout": connect_timeout_s,
            "request_timeout": request_timeout_s,
            "retry_strategy": pafs.AwsDefaultS3RetryStrategy(max_attempts=attempts_max),
            # Small objects in one PutObject instead of a multipart upload of one part.
            "allow_delayed_open": True,
            "allow_bucket_creation": False,
            "allow_bucket_deletion": False,
        }
        self._fs = S3FileSystem(**self._options)
        self._stream_fs: S3FileSystem | None = None
        """The client of `put_stream` (module docstring), made on its first use."""

    def _path(self, name: str) -> str:
        return f"{self._base}/{check_name(self.description, name)}"

    # --- ObjectStore --------------------------------------------------------------------------

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        check_size(self.description, name, data)
        try:
            info = self._fs.get_file_info(path)
            if info.type == pafs.FileType.File:
                if info.size == len(data) and self._read_all(path) == data:
                    return  # a retried put whose first attempt landed
                raise ObjectExists(self.description, name)
            if info.type == pafs.FileType.Directory:
                raise BadObjectName(self.description, name, "is the directory of other objects")
            with self._fs.open_output_stream(path, metadata={}) as out:
                out.write(data)
        except OSError as exc:
            raise self.typed_error(name, exc) from None

    def put_stream(self, name: str, produce: Callable[[pa.NativeFile], None]) -> int:
        """Write object `name` from `produce(out)`, which writes its bytes to `out` in any
        number of writes; its size in bytes. Memory stays at one part (`S3_PART_BYTES`)
        whatever the size: a multipart upload, each part sent before the next is buffered (an
        object below one part is one PutObject). The object is complete when this returns;
        an error (typed as the store's, or `produce`'s own) leaves no object under `name`
        (what pyarrow completed is deleted; the module docstring says why).

        Unlike `put`, an existing object of that name is replaced: this is for a job's output
        files (a retried task writes its part again), not for the engine's immutable
        objects."""
        path = self._path(name)
        if self._stream_fs is None:
            self._stream_fs = S3FileSystem(**self._options, background_writes=False)
        try:
            with self._stream_fs.open_output_stream(path, metadata={}) as out:
                try:
                    produce(out)
                    size_bytes: int = out.tell()
                except BaseException:
                    # Completes the upload (pyarrow cannot abort it): deleted below.
                    with contextlib.suppress(OSError):
                        out.close()
                    raise
        except BaseException as exc:
            # The first error is the one to report; a leftover is outside any manifest.
            with contextlib.suppress(ObjectStoreError):
                self.delete(name)
            if isinstance(exc, OSError):
                raise self.typed_error(name, exc) from None
            raise
        return size_bytes

    def get(self, name: str) -> bytes:
        path = self._path(name)
        try:
            return self._read_all(path)
        except OSError as exc:
            raise self.typed_error(name, exc) from None

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        path = self._path(name)
        try:
            with self._fs.open_input_file(path) as source:
                check_range(self.description, name, offset, length, source.size())
                data: bytes = source.read_at(length, offset) if length else b""
        except OSError as exc:
            raise self.typed_error(name, exc) from None
        if len(data) != length:
            raise ObjectStoreFailed(self.description, name, "short read inside the object")
        return data

    def open_input(self, name: str) -> pa.NativeFile:
        """A random-access file whose reads raise this store's typed errors (pyarrow passes a
        Python exception raised inside a read through its C++ readers unchanged)."""
        path = self._path(name)
        try:
            source = self._fs.open_input_file(path)
        except OSError as exc:
            raise self.typed_error(name, exc) from None
        return pa.PythonFile(_TypedErrorsFile(self, name, source), mode="r")

    def size(self, name: str) -> int:
        path = self._path(name)
        try:
            info = self._fs.get_file_info(path)
        except OSError as exc:
            raise self.typed_error(name, exc) from None
        if info.type != pafs.FileType.File:
            raise self._not_found(name)
        size_bytes: int = info.size
        return size_bytes

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(self.description, prefix)
        # List under the deepest "directory" the prefix names wholly, keep what matches.
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = f"{self._base}/{directory}" if directory else self._base
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        try:
            infos = self._fs.get_file_info(selector)
        except OSError as exc:
            raise self.typed_error("", exc) from None
        found = []
        skip = len(self._base) + 1
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            name = info.path[skip:]
            if name.startswith(prefix):
                found.append(ObjectInfo(name, info.size))
        found.sort(key=lambda object_info: object_info.name)
        return found

    def delete(self, name: str) -> None:
        path = self._path(name)
        try:
            self._fs.delete_file(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self.typed_error(name, exc) from None

    def check_bucket(self) -> None:
        """`ObjectStoreFailed` if the bucket does not exist, `ObjectStoreUnavailable` if the
        service does not answer: for the engine's open, to fail early with a clear reason."""
        try:
            exists = self._fs.get_file_info(self.bucket).type == pafs.FileType.Directory
        except OSError as exc:
            raise self.typed_error("", exc) from None
        if not exists:
            raise ObjectStoreFailed(self.description, "", "the bucket does not exist")

    # --- Private --------------------------------------------------------------------------------

    def _read_all(self, path: str) -> bytes:
        with self._fs.open_input_stream(path) as source:
            data: bytes = source.read()
        return data

    def _not_found(self, name: str) -> ObjectStoreError:
        """ObjectNotFound, or ObjectStoreFailed if what is missing is the whole bucket."""
        try:
            bucket_type = self._fs.get_file_info(self.bucket).type
        except OSError as exc:
            return _typed_aws_error(self.description, name, exc)
        if bucket_type != pafs.FileType.Directory:
            return ObjectStoreFailed(self.description, name, "the bucket does not exist")
        return ObjectNotFound(self.description, name)

    def typed_error(self, name: str, exc: OSError) -> ObjectStoreError:
        """`exc` from a request for `name` as the store's typed error (its readers use it)."""
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            return self._not_found(name)
        return _typed_aws_error(self.description, name, exc)


def _typed_aws_error(description: str, name: str, exc: OSError) -> ObjectStoreError:
    """The error tree's type for an OSError of pyarrow's S3 client (module docstring)."""
    text = str(exc)
    detail = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    found = _AWS_ERROR.search(text)
    code = found.group(1) if found else ""
    if code in _NOT_FOUND_AWS_ERRORS:
        return ObjectNotFound(description, name, detail)
    curl = _CURL_ERROR.search(text)
    transient_curl = curl is not None and int(curl.group(1)) in _TRANSIENT_CURL_CODES
    if code in _TRANSIENT_AWS_ERRORS or transient_curl or _HTTP_5XX.search(text):
        return ObjectStoreUnavailable(description, name, detail)
    return ObjectStoreFailed(description, name, detail)


class _TypedErrorsFile(io.RawIOBase):
    """pyarrow's S3 input file behind `pyarrow.PythonFile`, its OSErrors typed."""

    def __init__(self, store: S3ObjectStore, name: str, source: Any) -> None:
        super().__init__()
        self._store = store
        self._name = name
        self._source = source

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position: int = self._source.seek(offset, whence)
        return position

    def tell(self) -> int:
        position: int = self._source.tell()
        return position

    def read(self, size: int = -1) -> bytes:
        try:
            data: bytes = self._source.read(size if size is not None and size >= 0 else None)
        except OSError as exc:
            raise self._store.typed_error(self._name, exc) from None
        return data

    def close(self) -> None:
        if not self.closed:
            self._source.close()
        super().close()
