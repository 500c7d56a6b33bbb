import os
import stat

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from deltaferry.errors import ConfigError, WarehouseError
from deltaferry.spark.session import s3a_spark_conf
from deltaferry.storage import (
    LocalStorage,
    S3Settings,
    S3Storage,
    check_warehouse,
    describe_s3_failure,
    is_s3,
    s3a_hadoop_conf,
    spark_uri,
    split_s3_uri,
    storage_for,
)
from deltaferry_dev.stack import s3 as s3_stack

ENV = {"DELTAFERRY_S3_ENDPOINT": "http://127.0.0.1:8333/", "AWS_ACCESS_KEY_ID": "AK1",
       "AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "ListObjectsV2")


def test_uris():
    assert split_s3_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    assert split_s3_uri("s3a://bucket") == ("bucket", "")
    assert spark_uri("s3://b/p") == "s3a://b/p" and spark_uri("/local/wh") == "/local/wh"
    assert is_s3("s3a://b") and not is_s3("/tmp/s3://x")
    with pytest.raises(ConfigError, match="names no bucket"):
        split_s3_uri("s3:///prefix")


def test_settings_from_env_never_show_the_secret():
    settings = S3Settings.from_env(ENV)
    assert (settings.endpoint, settings.access_key, settings.region) == (
        "http://127.0.0.1:8333", "AK1", "us-east-1")
    assert "s3cr3t-value" not in repr(settings)
    assert S3Settings.from_env({**ENV, "AWS_REGION": "eu-west-3"}).region == "eu-west-3"
    assert S3Settings.from_env({}) == S3Settings()


@pytest.mark.parametrize("env, problem", [
    ({"DELTAFERRY_S3_ENDPOINT": "127.0.0.1:8333"}, "is not an http:// or https:// URL"),
    ({"AWS_ACCESS_KEY_ID": "AK1"}, "set both the access key id and the secret key"),
])
def test_bad_settings_are_named(env, problem):
    with pytest.raises(ConfigError, match=problem) as info:
        S3Settings.from_env(env)
    assert "s3cr3t" not in str(info.value)


def test_s3a_conf_for_a_local_server_is_path_style_with_the_credentials():
    conf = s3a_hadoop_conf(S3Settings.from_env(ENV))
    assert conf["fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert conf["fs.s3a.path.style.access"] == "true"
    assert conf["fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["fs.s3a.access.key"] == "AK1" and conf["fs.s3a.secret.key"] == "s3cr3t-value"
    assert conf["fs.s3a.aws.credentials.provider"].endswith("SimpleAWSCredentialsProvider")
    spark_conf = s3a_spark_conf(ENV)
    assert spark_conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:8333"


def test_s3a_conf_on_aws_leaves_endpoint_and_credentials_to_the_sdk():
    conf = s3a_hadoop_conf(S3Settings.from_env({"AWS_REGION": "eu-west-1"}))
    assert conf == {"fs.s3a.endpoint.region": "eu-west-1", "fs.s3a.retry.limit": "3",
                    "fs.s3a.attempts.maximum": "3"}


def test_s3_retries_bound_how_long_an_outage_is_retried():
    conf = s3a_hadoop_conf(S3Settings.from_env({"DELTAFERRY_S3_RETRIES": "0"}))
    assert (conf["fs.s3a.retry.limit"], conf["fs.s3a.attempts.maximum"]) == ("0", "1")
    with pytest.raises(ConfigError, match="DELTAFERRY_S3_RETRIES: must be a whole number"):
        S3Settings.from_env({"DELTAFERRY_S3_RETRIES": "many"})


def test_storage_for_picks_the_backend():
    assert isinstance(storage_for("/tmp/wh"), LocalStorage)
    assert isinstance(storage_for("s3a://b/p", ENV), S3Storage)


def test_local_put_if_absent_and_list(tmp_path):
    storage = LocalStorage()
    target = str(tmp_path / "s" / "v000001.json")
    assert storage.put_if_absent(target, b"first")
    assert not storage.put_if_absent(target, b"second")
    assert storage.read(target) == b"first"
    storage.write(str(tmp_path / "s" / "covered.json"), b"{}")
    assert storage.list(str(tmp_path / "s")) == ["covered.json", "v000001.json"]
    assert storage.list(str(tmp_path / "missing")) == []
    with pytest.raises(FileNotFoundError):
        storage.read(str(tmp_path / "nope"))


@pytest.mark.parametrize("exc, said", [
    (client_error("SignatureDoesNotMatch", 403), "credentials rejected"),
    (client_error("InvalidAccessKeyId", 403), "access key id not known"),
    (client_error("NoSuchBucket", 404), "bucket does not exist"),
    (client_error("AccessDenied", 403), "access denied"),
    (EndpointConnectionError(endpoint_url="http://x:1"), "endpoint not reachable"),
])
def test_failures_are_said_in_words(exc, said):
    assert describe_s3_failure(exc).startswith(said)


def test_check_warehouse_names_the_uri_and_the_cause_without_the_secret():
    check_warehouse("/any/local/folder")  # nothing to check
    env = {**ENV, "DELTAFERRY_S3_ENDPOINT": "http://127.0.0.1:1"}
    with pytest.raises(WarehouseError) as info:
        check_warehouse("s3://bucket/wh", env)
    message = str(info.value)
    assert message.startswith("warehouse s3://bucket/wh: endpoint not reachable at "
                              "http://127.0.0.1:1")
    assert "s3cr3t-value" not in message


def test_an_s3_failure_is_one_line_naming_the_object_without_the_secret():
    """Every S3 operation of the storage (the lock's, the schema store's) that fails after
    botocore's retries ends in one WarehouseError naming the object and the cause (here a real
    refused connection), never boto3's traceback or a credential."""
    storage = storage_for("s3://bucket/wh", {**ENV, "DELTAFERRY_S3_ENDPOINT": "http://127.0.0.1:1",
                                            "DELTAFERRY_S3_RETRIES": "0"})
    uri = "s3://bucket/wh/orders/_lock/00000001"
    for operation in (lambda: storage.read(uri), lambda: storage.write(uri, b"x"),
                      lambda: storage.put_if_absent(uri, b"x"), lambda: storage.list(uri),
                      lambda: storage.delete(uri)):
        with pytest.raises(WarehouseError) as info:
            operation()
        message = str(info.value)
        assert message.startswith(f"warehouse {uri}: endpoint not reachable"), message
        assert "\n" not in message and "s3cr3t-value" not in message


def test_stack_s3_server_command_and_identity(tmp_path):
    ports = dict(zip(s3_stack.PORT_NAMES, range(20000, 20000 + len(s3_stack.PORT_NAMES)), strict=True))
    key, secret = s3_stack.new_credentials()
    assert s3_stack.new_credentials() != (key, secret)
    config = tmp_path / "s3.json"
    s3_stack.write_private(config, "{}")
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    command = s3_stack.server_command("weed", ports, tmp_path / "data", config)
    assert command[:3] == ["weed", "-logtostderr", "server"]  # no log files in /tmp
    assert "-ip.bind=127.0.0.1" in command and "-master.telemetry=false" in command
    assert f"-s3.localSocket={tmp_path / 's3.sock'}" in command
    assert f"-filer.localSocket={tmp_path / 'filer.sock'}" in command
    assert "-s3.port=20000" in command and f"-s3.config={config}" in command
    assert secret not in " ".join(command)
    identity = s3_stack.identity_config(key, secret)["identities"][0]
    assert identity["credentials"] == [{"accessKey": key, "secretKey": secret}]


def test_stack_s3_server_is_not_started_on_a_socket_another_user_holds(tmp_path, other_user):
    """`weed` makes its parts' gRPC sockets in /tmp (/tmp/seaweedfs-master-grpc-PORT.sock):
    a socket another user made there first is refused by name, and ports are picked again."""
    import subprocess

    from deltaferry.errors import StackError
    from deltaferry_dev.stack.process import free_ports

    ports = dict(zip(s3_stack.PORT_NAMES, free_ports(len(s3_stack.PORT_NAMES)), strict=True))
    planted = s3_stack.grpc_socket("master", ports["master_grpc"])
    assert s3_stack.foreign_sockets(ports) == []
    subprocess.run(["touch", str(planted)], user=other_user.pw_uid, group=other_user.pw_gid,
                   extra_groups=[], check=True)
    try:
        assert s3_stack.foreign_sockets(ports) == [(planted, other_user.pw_uid)]
        with pytest.raises(StackError, match=f"{planted} belongs to another user"):
            s3_stack.start_server(tmp_path, ports)
        assert not (tmp_path / "s3").exists()  # refused before anything was written
    finally:
        planted.unlink()


def test_stack_state_file_is_owner_only(tmp_path):
    from deltaferry_dev import stack

    stack.write_state(tmp_path, {"version": 1, "assignments": {"AWS_SECRET_ACCESS_KEY": "x"}})
    assert stat.S_IMODE(os.stat(tmp_path / "state.json").st_mode) == 0o600


def test_airflow_asset_of_an_s3_table_is_its_s3_uri():
    from deltaferry.airflow.factory import table_asset_uri
    from deltaferry.paths import TopicPaths

    assert table_asset_uri(TopicPaths.for_topic("s3://lake/prod", "t").table) == "s3://lake/prod/t/table"
