"""The [otlp] table: off unless present, environment fallbacks with the config winning, one-line refusals."""

from __future__ import annotations

import os

import pytest

from agent.config import ConfigError, config_from_dict, load_config
from agent.otlp.config import OtlpConfig, OtlpFieldError, settings


def test_off_unless_the_table_is_there() -> None:
    assert config_from_dict({}).otlp is None
    assert config_from_dict({"otlp": {}}).otlp == OtlpConfig()


def test_a_header_that_is_not_ascii_is_one_line_naming_the_header_not_the_value(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[otlp]\nheaders = { Authorization = "Bearer s3cr\u00e9t" }\n', encoding="utf-8")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "\n" not in msg and "otlp.headers.Authorization: must be printable ASCII" in msg
    assert "s3cr" not in msg


def test_headers_are_credentials_under_the_0600_rule(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[otlp]\nheaders = { Authorization = "Bearer x" }\n')
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match=r"otlp.headers: holds a credential.*chmod 600"):
        load_config(path)
    os.chmod(path, 0o600)
    assert load_config(path).otlp.headers == {"Authorization": "Bearer x"}


@pytest.mark.parametrize("table, message", [
    ({"endpoint": "ftp://h:4318"}, "otlp.endpoint: must be an http:// or https:// URL"),
    ({"protocol": "grpc"}, "otlp.protocol: must be one of http/protobuf"),
    ({"timeout_seconds": 600}, "otlp.timeout_seconds: must be within [0.1, 60]"),
    ({"export_interval_seconds": 0.5}, "otlp.export_interval_seconds: must be 0"),
    ({"headers": {"Content-Type": "x"}}, "otlp.headers: must not set 'Content-Type'"),
    ({"resource": {"bad name": "x"}}, "otlp.resource: has an invalid attribute name"),
    ({"endpint": "http://h"}, "unknown key otlp.endpint (did you mean 'endpoint'?)"),
])
def test_bad_values_are_refused_with_their_key(table, message) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"otlp": table})
    assert message in str(err.value)


def test_environment_fills_what_the_config_leaves_out_and_the_config_wins() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20env,x-env=1",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
           "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=prod,service.name=from-env",
           "OTEL_SERVICE_NAME": "svc-env"}
    s = settings(OtlpConfig(), interval_seconds=5.0, environ=env, host="h1")
    assert s.url("metrics") == "http://collector:4318/v1/metrics"
    assert dict(s.headers) == {"authorization": "Bearer env", "x-env": "1"}
    assert s.timeout_seconds == 2.5 and s.export_interval_seconds == 5.0
    assert dict(s.resource) == {"service.name": "svc-env", "host.name": "h1", "deployment.environment.name": "prod"}
    mine = OtlpConfig(endpoint="http://mine:4318/", headers={"Authorization": "Bearer cfg"}, timeout_seconds=1,
                      export_interval_seconds=30, resource={"service.name": "mine"})
    s = settings(mine, interval_seconds=5.0, environ=env, host="h1")
    assert s.url("logs") == "http://mine:4318/v1/logs"
    assert dict(s.headers) == {"x-env": "1", "Authorization": "Bearer cfg"}
    assert s.timeout_seconds == 1 and s.export_interval_seconds == 30 and s.resource["service.name"] == "mine"
    assert settings(OtlpConfig(), interval_seconds=5.0, environ={}, host="h1").url("logs") == \
        "http://127.0.0.1:4318/v1/logs"


@pytest.mark.parametrize("env, variable", [
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "no-equals-sign"}, "OTEL_EXPORTER_OTLP_HEADERS"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "k=caf%C3%A9"}, "OTEL_EXPORTER_OTLP_HEADERS.k"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
])
def test_a_wrong_variable_is_refused_by_name(env, variable) -> None:
    with pytest.raises(OtlpFieldError) as err:
        settings(OtlpConfig(), interval_seconds=5.0, environ=env, host="h1")
    assert str(err.value).startswith(f"{variable}:")


def test_infersight_run_stops_at_start_on_a_wrong_variable_with_one_line(tmp_path) -> None:
    import subprocess
    import sys

    config = tmp_path / "c.toml"
    config.write_text(f'store_dir = "{tmp_path / "store"}"\nlisten = "127.0.0.1:1"\n[otlp]\n')
    out = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--config", str(config)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "infersight: config error: otlp: OTEL_EXPORTER_OTLP_TIMEOUT: must be a number of milliseconds"]
    assert not (tmp_path / "store").exists()
