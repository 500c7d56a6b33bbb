"""Delta tables read without a JVM, through delta-rs (the ``deltalake`` package).

Local folders as they are; ``s3://`` / ``s3a://`` URIs with the warehouse's S3 settings
(`deltaferry.storage.S3Settings`: endpoint, path-style addressing, credentials, region).
"""

from __future__ import annotations

from collections.abc import Mapping

from deltaferry.storage import S3Settings, is_s3


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


def is_delta_table(uri: str, env: Mapping[str, str] | None = None) -> bool:
    """True if a Delta table exists at `uri`."""
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(delta_rs_uri(uri), storage_options(uri, env))


def open_table(uri: str, env: Mapping[str, str] | None = None):
    """The delta-rs DeltaTable at `uri` (its latest version)."""
    from deltalake import DeltaTable

    return DeltaTable(delta_rs_uri(uri), storage_options=storage_options(uri, env))
