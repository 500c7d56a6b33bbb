"""The local stack's Schema Registry module (what can be checked without starting it)."""

import pytest

from deltaferry.errors import SetupError
from deltaferry_dev import stack
from deltaferry_dev.stack import registry


def test_registry_command_binds_loopback_and_url_is_the_ccompat_api(tmp_path):
    cmd = registry.registry_command("java", tmp_path / "registry-runner.jar", 18081)
    assert "-Dquarkus.http.host=127.0.0.1" in cmd and "-Dquarkus.http.port=18081" in cmd
    assert "-Xmx384m" in cmd  # modest memory beside Spark
    assert cmd[-2:] == ["-jar", str(tmp_path / "registry-runner.jar")]
    assert registry.registry_url(18081) == "http://127.0.0.1:18081/apis/ccompat/v7"


def test_the_registry_is_always_part_of_the_stack_started_last():
    assert stack.SERVICES[-1] is registry
    assert not hasattr(registry, "installed")  # nothing optional about it


def test_a_registry_that_is_not_built_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("DELTAFERRY_DEPS", str(tmp_path / "deps"))
    with pytest.raises(SetupError, match="make setup"):
        registry.launch(tmp_path / "stack", {})


def test_the_registry_clients_http_library_logs_no_line_per_request():
    import logging

    from deltaferry.registry import RegistrySettings, quiet_http_clients

    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.NOTSET)
    RegistrySettings.from_env({"DELTAFERRY_SCHEMA_REGISTRY_URL": "http://127.0.0.1:1"}).client()
    assert not logging.getLogger("httpx2").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.DEBUG)  # a user's own choice stays
    quiet_http_clients()
    assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    logging.getLogger("httpx").setLevel(logging.NOTSET)
