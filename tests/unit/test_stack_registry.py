"""The local stack's Schema Registry module (what runs without the registry built)."""

import pytest

from deltaferry.errors import SetupError
from deltaferry.stack import registry


def test_registry_command_binds_loopback_and_url_is_the_ccompat_api(tmp_path):
    cmd = registry.registry_command("java", tmp_path / "quarkus-run.jar", 18081)
    assert "-Dquarkus.http.host=127.0.0.1" in cmd and "-Dquarkus.http.port=18081" in cmd
    assert cmd[-2:] == ["-jar", str(tmp_path / "quarkus-run.jar")]
    assert registry.registry_url(18081) == "http://127.0.0.1:18081/apis/ccompat/v7"


def test_a_registry_that_is_not_built_is_not_installed_and_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("DELTAFERRY_DEPS", str(tmp_path / "deps"))
    assert not registry.installed()
    with pytest.raises(SetupError, match="make registry"):
        registry.launch(tmp_path / "stack", {})
