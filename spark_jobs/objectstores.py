"""Where an engine's objects (checkpoints, block objects) are read from, and where a run's
outputs go: a local directory or S3. Both are the engine's own object store port
(engine/objects/store.py `LocalDirStore`, engine/objects/s3.py `S3ObjectStore`), so the jobs
read checkpoints and blocks with the engine's codecs whichever holds them, on the driver and
on Spark's executors alike (through pyarrow's S3 client, not Hadoop's: pyspark ships no
hadoop-aws, and the engine's store already types S3's errors).

A location is a path (`/var/lib/engine/objects`) or `s3://BUCKET[/PREFIX]`. S3 is configured
the way AWS's own tools are, from the environment, so that Spark's Python workers (which
inherit the driver's environment locally, or get `spark.executorEnv.*` on a cluster: see
session.py) open the same store:

    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY   credentials (required)
    AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL    http(s)://HOST[:PORT] of an S3-compatible
                                               service (default: AWS, https)
    AWS_REGION or AWS_DEFAULT_REGION           default us-east-1

`--s3-endpoint URL` on the CLI sets AWS_ENDPOINT_URL_S3 for the run. Credentials never go
into a manifest or a job's options.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from engine.objects.errors import ObjectsError
from engine.objects.store import LocalDirStore, ObjectStore
from spark_jobs.errors import BadInput, ObjectsUnreadable

S3_SCHEME = "s3://"
ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
REGION_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION")
REGION_DEFAULT = "us-east-1"
S3_ENVS = (ACCESS_KEY_ENV, SECRET_KEY_ENV, *ENDPOINT_ENVS, *REGION_ENVS)
"""What executors need in their environment to open an S3 location."""
_ENDPOINT_URL = re.compile(r"^(https?)://([^/\s]+?)/?$")


def is_s3(location: str) -> bool:
    return location.startswith(S3_SCHEME)


@dataclass(frozen=True, slots=True)
class S3Settings:
    endpoint: str  # HOST[:PORT]
    scheme: str  # http | https
    region: str
    access_key: str
    secret_key: str

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        region = next((env[k] for k in REGION_ENVS if env.get(k)), REGION_DEFAULT)
        url = next((env[k] for k in ENDPOINT_ENVS if env.get(k)), None)
        if url is None:
            endpoint, scheme = f"s3.{region}.amazonaws.com", "https"
        else:
            match = _ENDPOINT_URL.match(url)
            if match is None:
                raise BadInput(f"S3 endpoint {url!r}: expected http(s)://HOST[:PORT]")
            scheme, endpoint = match.group(1), match.group(2)
        access, secret = env.get(ACCESS_KEY_ENV), env.get(SECRET_KEY_ENV)
        if not access or not secret:
            raise BadInput(f"an s3:// location needs {ACCESS_KEY_ENV} and {SECRET_KEY_ENV} set")
        return S3Settings(endpoint, scheme, region, access, secret)


def split_s3(location: str) -> tuple[str, str]:
    """s3://bucket/some/prefix -> ("bucket", "some/prefix")."""
    assert is_s3(location)
    bucket, _, prefix = location[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise BadInput(f"{location!r}: s3://BUCKET[/PREFIX]")
    return bucket, prefix.strip("/")


def open_objects(location: str, *, read_only: bool = True) -> ObjectStore:
    """The object store at `location`. A local directory must exist and is opened read-only
    unless `read_only` is false (no lock taken, nothing removed: the engine may be running).
    An S3 location is checked to exist (its bucket answers)."""
    if not is_s3(location):
        if read_only and not os.path.isdir(location):
            raise BadInput(f"no objects directory at {location}")
        return LocalDirStore(location, read_only=read_only)
    bucket, prefix = split_s3(location)
    settings = S3Settings.from_env()
    from engine.objects.s3 import S3ObjectStore  # pyarrow's S3 client: only when asked for

    try:
        store = S3ObjectStore(
            settings.endpoint,
            bucket,
            prefix,
            settings.access_key,
            settings.secret_key,
            region=settings.region,
            scheme=settings.scheme,
        )
        store.check_bucket()
    except ObjectsError as exc:
        raise ObjectsUnreadable(location, str(exc)) from None
    return store


def location_of(store: ObjectStore) -> str:
    """The location `open_objects` opens `store` from again (on an executor)."""
    if isinstance(store, LocalDirStore):
        return store.root
    assert is_s3(store.description), store.description  # S3ObjectStore: s3://bucket/prefix
    return store.description
