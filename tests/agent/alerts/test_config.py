"""[alerts] and [[receivers]]: defaults, one-line errors naming the key, secrets read safely and never shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.alerts.config import ReceiverConfig, redact_url
from agent.alerts.secrets import load_secret
from agent.config import Config, ConfigError, load_config


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "infersight.toml"
    path.write_text(text)
    path.chmod(0o600)  # receivers may hold credentials, and such a config must not be readable by others
    return load_config(path)


def test_issue_example_parses_and_relative_secret_resolves(tmp_path: Path) -> None:
    config = load(tmp_path, """
[alerts]
group_wait_seconds = 10
repeat_interval_seconds = 14400
resolve = true

[[receivers]]
name = "ops"
kind = "webhook"
url = "http://127.0.0.1:9099/hook"
timeout_seconds = 5
min_severity = "warning"
targets = ["workload"]
headers = { "X-Team" = "ml" }
hmac_secret_file = "ops.secret"
""")
    (r,) = config.receivers
    assert r == ReceiverConfig(name="ops", url="http://127.0.0.1:9099/hook", targets=("workload",),
                               headers={"X-Team": "ml"}, hmac_secret_file=tmp_path / "ops.secret")
    assert config.alerts.group_wait_seconds == 10 and config.alerts.retry_max_age_seconds == 86400
    assert Config().receivers == ()


@pytest.mark.parametrize("text, message", [
    ('[[receivers]]\nname = "a"\nurl = "file:///etc/passwd"',
     "receivers[0].url: must be an http:// or https:// URL with a host, got 'file:///…'"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\nkind = "pagerduty"',
     "receivers[0].kind: must be one of webhook, slack, alertmanager, got 'pagerduty'"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\nhmac_secret = "x"',
     "unknown key receivers[0].hmac_secret (did you mean 'hmac_secret_env'?)"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\nmin_severity = "info"',
     "receivers[0].min_severity: must be one of warning, critical, got 'info'"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\ntimeout_seconds = 0',
     "receivers[0].timeout_seconds: must be within [0.1, 60], got 0.0"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\nheaders = { "Idempotency-Key" = "k" }',
     "receivers[0].headers: must not set 'Idempotency-Key': infersight sets it"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\nheaders = { "X-A" = "1\\r\\nX-B: 2" }',
     "receivers[0].headers.X-A: must be a one-line string"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\nhmac_secret_env = "A"\nhmac_secret_file = "f"',
     "receivers[0]: set at most one of hmac_secret_file, hmac_secret_env"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\n[[receivers]]\nname = "a"\nurl = "http://y/"',
     "receivers[1].name: duplicates another receiver's name, got 'a'"),
    ('[[receivers]]\nurl = "http://x/"', "receivers[0].name: missing (required)"),
    ('[alerts]\ngroup_wait = 5', "unknown key alerts.group_wait (did you mean 'group_wait_seconds'?)"),
    ('[alerts]\nrepeat_interval_seconds = 1', "alerts.repeat_interval_seconds: must be within [60, 2592000], got 1.0"),
    ('[[receivers]]\nname = "a"\nurl = "https://hooks.slack.com/services/T0/B0/SECRETTOKEN"\nkind = "slack"\n'
     'timeout_seconds = 99', "receivers[0].timeout_seconds: must be within [0.1, 60], got 99.0"),
    ('[[receivers]]\nname = "a"\nurl = "http://127.0.0.1:abc/h"',
     "receivers[0].url: has an invalid port (must be a number within [1, 65535])"),
    ('[[receivers]]\nname = "a"\nurl = "http://127.0.0.1:99999/h"',
     "receivers[0].url: has an invalid port (must be a number within [1, 65535])"),
    ('[[receivers]]\nname = "a"\nurl = "http://127.0.0.1:0/h"',
     "receivers[0].url: has an invalid port (must be a number within [1, 65535])"),
    ('[[receivers]]\nname = "a"\nurl = "http://[::1/h"',
     "receivers[0].url: must be an http:// or https:// URL with a host, got an unparseable URL"),
    ('[alerts]\nexternal_url = "http://gpu-7:http/"',
     "alerts.external_url: has an invalid port (must be a number within [1, 65535])"),
    ('[alerts]\nexternal_url = "ftp://u:pw@gpu-7/x?t=1"',
     "alerts.external_url: must be an http:// or https:// URL, got 'ftp://gpu-7/x?…'"),
])
def test_errors_are_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert str(info.value) == f"{tmp_path / 'infersight.toml'}: {message}"


def test_url_with_credentials_is_never_echoed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, '[[receivers]]\nname = "a"\nurl = "gopher://user:pw@host/path?token=t"')
    assert "pw" not in str(info.value) and "token" not in str(info.value)
    slack = ReceiverConfig(name="s", kind="slack", url="https://hooks.slack.com/services/T0/B0/SECRETTOKEN")
    assert slack.safe_url == "https://hooks.slack.com/…"
    hook = ReceiverConfig(name="h", url="https://u:p@example.com/hook?key=v")
    assert hook.safe_url == "https://example.com/hook?…"


@pytest.mark.parametrize("url, shown", [
    ("http://u:pw@127.0.0.1:abc/h?t=1", "http://127.0.0.1/h?…"),
    ("http://127.0.0.1:99999/h", "http://127.0.0.1/h"),
    ("http://u:pw@[::1/h", "(unparseable URL)"),
])
def test_redacting_a_url_that_skipped_the_check_never_raises(url: str, shown: str) -> None:
    # The daemon shows receiver URLs in logs, the page and `infersight alerts`: a URL that escaped the config
    # check must not turn any of them into a traceback.
    assert redact_url(url) == shown


TOKEN = "tok3n-do-not-echo"


@pytest.mark.parametrize("text, message", [
    (f'[receivers]\nname = "a"\nurl = "https://hooks.example/{TOKEN}"',
     "receivers: expected an array of tables, got a table"),
    (f'receivers = "https://hooks.slack.com/services/T0/B0/{TOKEN}"',
     "receivers: expected an array of tables, got a string"),
    (f'receivers = ["https://hooks.slack.com/services/T0/B0/{TOKEN}"]',
     "receivers[0]: expected a table, got a string"),
    (f'[[receivers]]\nname = "a"\nurl = ["https://x/?token={TOKEN}"]',
     "receivers[0].url: expected a string, got an array"),
    (f'[[receivers]]\nname = "a"\nurl = "http://x/"\nheaders = "Authorization: Bearer {TOKEN}"',
     "receivers[0].headers: expected a table, got a string"),
    (f'[[receivers]]\nname = "a"\nurl = "http://x/"\nheaders = {{ Authorization = ["Bearer {TOKEN}"] }}',
     "receivers[0].headers.Authorization: expected a string, got an array"),
    ('[[receivers]]\nname = "a"\nurl = "http://x/"\nheaders = { X-Key = 123456789 }',
     "receivers[0].headers.X-Key: expected a string, got an integer"),
    (f'[[receivers]]\nname = "a"\nurl = "http://x/"\nhmac_secret_file = {{ path = "{TOKEN}" }}',
     "receivers[0].hmac_secret_file: expected a path string, got a table"),
    (f'[[receivers]]\nname = "a"\nurl = "http://x/"\nhmac_secret_env = "{TOKEN}"',
     "receivers[0].hmac_secret_env: must be the name of an environment variable (letters, digits, _), "
     "not the secret itself"),
    (f'[alerts]\nexternal_url = ["http://u:{TOKEN}@x/"]', "alerts.external_url: expected a string, got an array"),
    (f'interval_seconds = ["{TOKEN}"]', "interval_seconds: expected a number, got an array"),
])
def test_type_errors_name_the_type_not_a_value_that_may_hold_a_token(tmp_path: Path, text: str,
                                                                      message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert str(info.value) == f"{tmp_path / 'infersight.toml'}: {message}"
    assert TOKEN not in str(info.value) and "123456789" not in str(info.value)


def receiver(tmp_path: Path, mode: int, content: bytes = b"s3cr3t\n") -> ReceiverConfig:
    path = tmp_path / "secrets" / "ops.secret"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_bytes(content)
    path.chmod(mode)
    return ReceiverConfig(name="ops", url="http://127.0.0.1:1/", hmac_secret_file=path)


def test_secret_file_root_only_is_read_and_never_printed(tmp_path: Path) -> None:
    secret = load_secret(receiver(tmp_path, 0o600))
    assert secret.reveal() == b"s3cr3t"
    assert "s3cr3t" not in repr(secret) and "s3cr3t" not in str(secret) and "s3cr3t" not in f"{secret}"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_secret_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    with pytest.raises(ConfigError) as info:
        load_secret(receiver(tmp_path, mode))
    assert f"mode {mode:04o}" in str(info.value) and "s3cr3t" not in str(info.value)


def test_secret_file_in_a_writable_directory_or_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    r = receiver(tmp_path, 0o600)
    r.hmac_secret_file.parent.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by every user"):
        load_secret(r)
    r.hmac_secret_file.parent.chmod(0o700)
    os.chown(r.hmac_secret_file, 4321, 4321)
    with pytest.raises(ConfigError, match="owned by uid 4321"):
        load_secret(r)


def test_secret_symlink_empty_and_env(tmp_path: Path) -> None:
    r = receiver(tmp_path, 0o600, b"\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_secret(r)
    link = tmp_path / "secrets" / "link.secret"
    link.symlink_to(r.hmac_secret_file)
    with pytest.raises(ConfigError, match="cannot read"):
        load_secret(ReceiverConfig(name="ops", url="http://127.0.0.1:1/", hmac_secret_file=link))
    env = ReceiverConfig(name="ops", url="http://127.0.0.1:1/", hmac_secret_env="OPS_SECRET")
    assert load_secret(env, environ={"OPS_SECRET": "abc"}).reveal() == b"abc"
    with pytest.raises(ConfigError, match="receivers.ops.hmac_secret_env: environment variable 'OPS_SECRET' is not"):
        load_secret(env, environ={})
