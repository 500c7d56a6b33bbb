"""Delta tables read without a JVM, through delta-rs (the ``deltalake`` package).

Local folders as they are; ``s3://`` / ``s3a://`` URIs with the warehouse's S3 settings
(`deltaferry.storage.S3Settings`: endpoint, path-style addressing, credentials, region).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from deltaferry.storage import S3Settings, is_s3

#: delta-rs trusts the CAs of the file named by SSL_CERT_FILE when it builds a table's HTTP
#: client (no storage option names a CA); the variable is set only while one is built.
_CA_VARIABLE = "SSL_CERT_FILE"
_ca_lock = threading.Lock()


def delta_rs_uri(uri: str) -> str:
    """The URI delta-rs understands: s3a:// (Spark's scheme) as s3://, folders as they are."""
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def storage_options(uri: str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """delta-rs storage options for `uri`: the S3 settings of `env` (os.environ by default)."""
    if not is_s3(uri):
        return None
    settings = S3Settings.from_env(env)
    options = {"AWS_REGION": settings.region}
    if settings.endpoint:
        options["AWS_ENDPOINT_URL"] = settings.endpoint
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        options["AWS_ALLOW_HTTP"] = str(settings.endpoint.startswith("http://")).lower()
    if settings.access_key:
        options["AWS_ACCESS_KEY_ID"] = settings.access_key
        options["AWS_SECRET_ACCESS_KEY"] = settings.secret_key or ""
    return options


@contextmanager
def trusting(uri: str, env: Mapping[str, str] | None = None) -> Iterator[None]:
    """While inside, delta-rs clients built for `uri` trust the S3 CA bundle
    (DELTAFERRY_S3_CA_BUNDLE, else AWS_CA_BUNDLE) when there is one; one build at a time."""
    bundle = S3Settings.from_env(env).ca_bundle if is_s3(uri) else None
    if not bundle:
        yield
        return
    with _ca_lock:
        before = os.environ.get(_CA_VARIABLE)
        os.environ[_CA_VARIABLE] = bundle
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(_CA_VARIABLE, None)
            else:
                os.environ[_CA_VARIABLE] = before


def is_delta_table(uri: str, env: Mapping[str, str] | None = None) -> bool:
    """True if a Delta table exists at `uri`."""
    from deltalake import DeltaTable

    with trusting(uri, env):
        return DeltaTable.is_deltatable(delta_rs_uri(uri), storage_options(uri, env))


def open_table(uri: str, env: Mapping[str, str] | None = None):
    """The delta-rs DeltaTable at `uri` (its latest version)."""
    from deltalake import DeltaTable

    with trusting(uri, env):
        return DeltaTable(delta_rs_uri(uri), storage_options=storage_options(uri, env))


def layout_text(partitions: list[str], clustering: list[str] | None) -> str:
    """A table's layout in words: partitioned by, clustered by, or neither."""
    if partitions:
        return f"partitioned by {', '.join(partitions)}"
    if clustering is None:
        return "clustered (its columns are older than the history searched)"
    if clustering:
        return f"clustered by {', '.join(clustering)} (liquid clustering)"
    return "neither partitioned nor clustered"
