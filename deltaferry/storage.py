"""Where the warehouse lives: a local folder or an S3-compatible bucket, seen from Python.

Spark reaches the warehouse through Hadoop (``s3a://`` for S3); the Python side (the schema
cache, the early checks) goes through this module: `storage_for(uri)` returns a `LocalStorage` or
an `S3Storage` (boto3) with the same five operations, so the schema cache is written one way.

S3 settings come from the environment, validated once into `S3Settings`:

* ``DELTAFERRY_S3_ENDPOINT``: the server's URL (``http://127.0.0.1:8333``, MinIO, Ceph...);
  unset means AWS itself. A custom endpoint is addressed path-style (``endpoint/bucket/key``),
  which local servers need.
* ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``: unset means the AWS SDKs' default chain.
* ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``): default ``us-east-1``.
* ``DELTAFERRY_S3_CA_BUNDLE`` (else ``AWS_CA_BUNDLE``): the CAs (PEM) an https endpoint is
  checked against, by boto3 (``verify``), delta-rs and Spark's S3A (a JVM truststore made from
  them, `deltaferry.tls.jvm_truststore_options`); unset means the system's CAs.
* ``DELTAFERRY_S3_RETRIES``: how often Spark's S3A retries a request that failed (a server that
  does not answer), default 3: an S3 outage then fails a run's step within about 15 s, and
  Airflow's retries with back-off take over. Hadoop's own defaults wait about 5 minutes per
  request; throttling (503 Slow Down) keeps S3A's separate, longer retries.

The secret never appears in a repr, a log line, an error message or a command line: Spark gets it
as Hadoop configuration set inside the running driver (`s3a_hadoop_conf`, the keys in
`S3A_CREDENTIAL_KEYS`; see `deltaferry.spark.session`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from deltaferry import env as envvars
from deltaferry.errors import ConfigError, WarehouseError

S3_SCHEMES = ("s3://", "s3a://")
ENDPOINT_VAR = envvars.S3_ENDPOINT.name
RETRIES_VAR = envvars.S3_RETRIES.name
DEFAULT_REGION = envvars.AWS_DEFAULT_REGION.default
#: S3A's retries of a failed request (see the module docstring).
DEFAULT_RETRIES = int(envvars.S3_RETRIES.default)
#: The S3A properties that carry credentials: never Spark configuration, which can reach a
#: command line; set on the running session's Hadoop configuration instead.
S3A_CREDENTIAL_KEYS = ("fs.s3a.aws.credentials.provider", "fs.s3a.access.key",
                       "fs.s3a.secret.key")


def is_s3(uri: str) -> bool:
    """True for an ``s3://`` or ``s3a://`` URI."""
    return uri.startswith(S3_SCHEMES)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (``bucket``, ``some/prefix``); ConfigError if no bucket."""
    if not is_s3(uri):
        raise ConfigError(uri, "is not an s3:// URI")
    rest = uri.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigError(uri, "names no bucket (expected s3://bucket/prefix)")
    return bucket, key.strip("/")


def spark_uri(uri: str) -> str:
    """The URI Spark (Hadoop's S3A) understands: ``s3://`` becomes ``s3a://``; local paths stay."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def join(root: str, *parts: str) -> str:
    """Join a local path or a URI with '/'."""
    return "/".join([root.rstrip("/")] + [p.strip("/") for p in parts])


def ca_bundle_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """DELTAFERRY_S3_CA_BUNDLE, else AWS_CA_BUNDLE; None when neither is set."""
    return envvars.S3_CA_BUNDLE.value(env) or envvars.AWS_CA_BUNDLE.value(env) or None


@dataclass(frozen=True)
class S3Settings:
    """Endpoint, credentials and region of an S3-compatible store (the secret is never shown)."""

    endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    region: str = DEFAULT_REGION
    retries: int = DEFAULT_RETRIES
    ca_bundle: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        """Read DELTAFERRY_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
        DELTAFERRY_S3_RETRIES and DELTAFERRY_S3_CA_BUNDLE (else AWS_CA_BUNDLE)."""
        endpoint = envvars.S3_ENDPOINT.value(env).rstrip("/") or None
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(ENDPOINT_VAR, f"{endpoint!r} is not an http:// or https:// URL")
        access = envvars.AWS_ACCESS_KEY_ID.raw(env) or None
        secret = envvars.AWS_SECRET_ACCESS_KEY.raw(env) or None
        if bool(access) != bool(secret):
            raise ConfigError("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
                              "set both the access key id and the secret key, or neither")
        region = envvars.AWS_REGION.raw(env) or envvars.AWS_DEFAULT_REGION.value(env)
        retries = envvars.S3_RETRIES.value(env)
        if not retries.isdigit():
            raise ConfigError(RETRIES_VAR, f"must be a whole number >= 0, got {retries!r}")
        return cls(endpoint, access, secret, region, int(retries), ca_bundle_from_env(env))

    @property
    def ca_setting(self) -> str:
        """The variable that names the CA bundle (for messages)."""
        return envvars.S3_CA_BUNDLE.name

    def client(self):
        """A boto3 S3 client for these settings (path-style addressing for custom endpoints)."""
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": "path" if self.endpoint else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        )
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=config,
            verify=self.ca_bundle,
        )


def s3a_hadoop_conf(settings: S3Settings) -> dict[str, str]:
    """Hadoop S3A properties (without the ``spark.hadoop.`` prefix) for `settings`: endpoint,
    region, credentials, and the retries of a failed request (S3A's and the AWS SDK's own
    attempts, see DELTAFERRY_S3_RETRIES)."""
    conf = {"fs.s3a.endpoint.region": settings.region,
            "fs.s3a.retry.limit": str(settings.retries),
            "fs.s3a.attempts.maximum": str(max(1, settings.retries))}
    if settings.endpoint:
        conf["fs.s3a.endpoint"] = settings.endpoint
        conf["fs.s3a.path.style.access"] = "true"
        conf["fs.s3a.connection.ssl.enabled"] = str(settings.endpoint.startswith("https://")).lower()
    if settings.access_key:
        conf["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")
        conf["fs.s3a.access.key"] = settings.access_key
        conf["fs.s3a.secret.key"] = settings.secret_key or ""
    return conf


class Storage(Protocol):
    """What the schema cache needs from a warehouse location."""

    def read(self, uri: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""

    def write(self, uri: str, data: bytes) -> None:
        """Replace the object whole: a reader sees the old or the new content, never a mix."""

    def put_if_absent(self, uri: str, data: bytes) -> bool:
        """Create the object whole unless it exists; False (nothing written) if it existed."""

    def list(self, uri: str) -> list[str]:
        """Names of the objects directly under the folder `uri` ([] if there is none)."""

    def delete(self, uri: str) -> None:
        """Remove the object (nothing if it does not exist)."""


class LocalStorage:
    """A folder on the local file system."""

    def read(self, uri: str) -> bytes:
        with open(uri, "rb") as handle:
            return handle.read()

    def _temp(self, uri: str, data: bytes) -> str:
        folder = os.path.dirname(uri)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def write(self, uri: str, data: bytes) -> None:
        os.replace(self._temp(uri, data), uri)

    def put_if_absent(self, uri: str, data: bytes) -> bool:
        tmp = self._temp(uri, data)
        try:
            os.link(tmp, uri)  # fails if the name exists: the first writer wins
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def list(self, uri: str) -> list[str]:
        return sorted(os.listdir(uri)) if os.path.isdir(uri) else []

    def delete(self, uri: str) -> None:
        try:
            os.unlink(uri)
        except FileNotFoundError:
            pass


class S3Storage:
    """Objects in an S3-compatible bucket, through boto3.

    A PUT replaces an object atomically; `put_if_absent` is a conditional PUT
    (``If-None-Match: *``), which the store refuses with 412 when the key exists.
    """

    def __init__(self, settings: S3Settings, client=None):
        self.settings = settings
        self._client = client

    @property
    def client(self):
        if self._client is None:
            self._client = self.settings.client()
        return self._client

    def read(self, uri: str) -> bytes:
        bucket, key = split_s3_uri(uri)
        with s3_errors(uri):
            try:
                return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
            except self.client.exceptions.NoSuchKey:
                raise FileNotFoundError(uri) from None

    def write(self, uri: str, data: bytes) -> None:
        bucket, key = split_s3_uri(uri)
        with s3_errors(uri):
            self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def put_if_absent(self, uri: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split_s3_uri(uri)
        with s3_errors(uri):
            try:
                self.client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                # 412: the key exists; 409: another conditional PUT of that key is in flight.
                if status in (409, 412) or exc.response.get("Error", {}).get("Code") in (
                        "PreconditionFailed", "ConditionalRequestConflict"):
                    return False
                raise
        return True

    def list(self, uri: str) -> list[str]:
        bucket, key = split_s3_uri(uri)
        prefix = f"{key}/" if key else ""
        names = []
        with s3_errors(uri):
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=prefix, Delimiter="/"):
                names += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
        return sorted(names)

    def delete(self, uri: str) -> None:
        bucket, key = split_s3_uri(uri)
        with s3_errors(uri):
            self.client.delete_object(Bucket=bucket, Key=key)


@contextlib.contextmanager
def s3_errors(uri: str) -> Iterator[None]:
    """A block whose S3 errors (botocore's, after its own retries) become one WarehouseError
    naming `uri` and the cause in words (`describe_s3_failure`): a run then ends in one line,
    not a traceback through boto3."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise WarehouseError(uri, describe_s3_failure(exc)) from exc


def storage_for(uri: str, env: Mapping[str, str] | None = None) -> Storage:
    """The storage backend of `uri`: S3 (settings from `env`) for s3:// and s3a://, else local."""
    return S3Storage(S3Settings.from_env(env)) if is_s3(uri) else LocalStorage()


def describe_s3_failure(exc: BaseException) -> str:
    """What went wrong talking to S3, in words a user can act on (never a credential)."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return "endpoint not reachable"
    if isinstance(exc, ReadTimeoutError):
        return "endpoint did not answer in time"
    if isinstance(exc, NoCredentialsError):
        return "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket", "404") or status == 404:
            return "bucket does not exist"
        if code in ("InvalidAccessKeyId",):
            return "access key id not known to the server (check AWS_ACCESS_KEY_ID)"
        if code in ("SignatureDoesNotMatch",):
            return ("credentials rejected: the secret key does not match "
                    "(check AWS_SECRET_ACCESS_KEY)")
        if code in ("AccessDenied", "403") or status == 403:
            return "access denied: the credentials may not list this bucket"
        return f"{code or status}: {error.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}"


def check_warehouse(uri: str, env: Mapping[str, str] | None = None) -> None:
    """Fail early, naming `uri` and the cause, if the warehouse cannot be used.

    For S3: an https endpoint's certificate is accepted (TlsError otherwise), the endpoint
    answers, the credentials are accepted and the bucket exists (one ListObjectsV2 of at most
    one key under the prefix). A local folder needs no check: it is
    created on first write.
    """
    if not is_s3(uri):
        return
    from deltaferry.tls import check_url

    settings = S3Settings.from_env(env)
    bucket, key = split_s3_uri(uri)
    if settings.endpoint:  # a refused certificate in one line (TlsError), before boto3's words
        check_url("s3", settings.endpoint, settings.ca_bundle, settings.ca_setting)
    try:
        settings.client().list_objects_v2(Bucket=bucket, Prefix=f"{key}/" if key else "",
                                          MaxKeys=1)
    except Exception as exc:  # botocore's errors; each becomes one sentence
        where = f" at {settings.endpoint}" if settings.endpoint else ""
        raise WarehouseError(uri, describe_s3_failure(exc) + where) from None
