"""Config: defaults, every validation error's one-line message, presets, and path trust checks."""

from __future__ import annotations

import os
import stat as stat_mod
from pathlib import Path

import pytest

from agent.config import (
    DEFAULT_TARGET_REGEX,
    Config,
    ConfigError,
    LatencySpec,
    StacksConfig,
    TargetSpec,
    UntrustedPath,
    check_config_paths,
    check_trusted_path,
    load_config,
    parse_listen,
)
from agent.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    return d


def write(conf_dir: Path, text: str) -> Path:
    path = conf_dir / "infersight.toml"
    path.write_text(text)
    path.chmod(0o644)
    return path


def error_of(conf_dir: Path, text: str) -> str:
    path = write(conf_dir, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg, f"message is not one line: {msg!r}"
    assert msg.startswith(f"{path}: "), msg
    return msg[len(f"{path}: "):]


def test_no_file_gives_defaults_with_the_bundled_workload_target() -> None:
    c = load_config(None)
    assert c == Config()
    assert (c.interval_seconds, c.listen) == (5.0, "127.0.0.1:9464")
    assert c.stacks == StacksConfig(enabled=True, rate_hz=3, burst_rate_hz=49, burst_hold_segments=3,
                                    burst_max_seconds=30.0, burst_rise_windows=2, segment_seconds=5, steady_segment_seconds=15, nonblocking=True)
    assert c.store_dir == Path("/var/lib/infersight")
    assert c.probes.enabled() == ["syscalls", "offcpu", "gc", "tcp", "runqueue", "delivery"]
    (t,) = c.targets
    assert t.name == "workload" and t.process_regex == DEFAULT_TARGET_REGEX
    assert t.pattern.search("/work/main/.venv/bin/python -m workload serve --port 8000")
    assert not t.pattern.search("python -m workload load --rate 10")
    assert t.latency == LatencySpec.from_preset("workload")
    assert t.latency.url == "http://127.0.0.1:8000/metrics"
    assert t.latency.metric == "vllm:e2e_request_latency_seconds"


def test_empty_file_equals_no_file(conf_dir: Path) -> None:
    assert load_config(write(conf_dir, "")) == Config(store_dir=Path("/var/lib/infersight"))


def test_full_file_is_read(conf_dir: Path) -> None:
    path = write(conf_dir, """
interval_seconds = 2
store_dir = "var"
retention_days = 0.5
retention_bytes = 2097152
listen = "[::1]:9999"
log_level = "debug"
[probes]
gc = false
[stacks]
rate_hz = 97
nonblocking = false
[[targets]]
name = "llm"
process_regex = "vllm\\\\.entrypoints"
latency = { preset = "vllm", url = "http://10.0.0.2:8001/metrics" }
[[targets]]
name = "tgi"
pidfile = "/run/tgi.pid"
[targets.latency]
preset = "tgi"
[[targets]]
name = "triton"
pid = 4242
latency = { preset = "triton", timeout_seconds = 1.5, max_body_bytes = 1048576, max_series = 200 }
[[targets]]
name = "custom"
pid = 4243
latency = { url = "https://h/metrics", metric = "my_latency_ms", unit_seconds = 0.001 }
""")
    c = load_config(path)
    assert c.interval_seconds == 2.0 and isinstance(c.interval_seconds, float)
    assert c.store_dir == conf_dir / "var"
    assert (c.retention_days, c.retention_bytes, c.retention_seconds) == (0.5, 2097152, 43200.0)
    assert c.listen_address == ("::1", 9999)
    assert (c.stacks.rate_hz, c.stacks.nonblocking, c.stacks.enabled, c.log_level) == (97, False, True, "debug")
    assert c.probes.enabled() == ["syscalls", "offcpu", "tcp", "runqueue", "delivery"]
    llm, tgi, triton, custom = c.targets
    assert llm.latency.url == "http://10.0.0.2:8001/metrics"
    assert llm.latency.metric == "vllm:e2e_request_latency_seconds" and llm.latency.preset == "vllm"
    assert tgi.pidfile == Path("/run/tgi.pid") and tgi.latency.metric == "tgi_request_duration"
    assert triton.pid == 4242 and triton.latency.kind == "counter"
    assert triton.latency.metric == "nv_inference_request_duration_us"
    assert triton.latency.count_metric == "nv_inference_request_success"
    assert triton.latency.unit_seconds == 1e-6 and triton.latency.timeout_seconds == 1.5
    assert (triton.latency.max_body_bytes, triton.latency.max_series) == (1 << 20, 200)
    assert (tgi.latency.max_body_bytes, tgi.latency.max_series) == (16 << 20, 10_000)  # the defaults
    assert custom.latency == LatencySpec(url="https://h/metrics", metric="my_latency_ms", unit_seconds=0.001)


def test_example_config_in_docs_loads() -> None:
    c = load_config(REPO / "docs" / "infersight.example.toml")
    assert [t.name for t in c.targets] == ["workload"]


@pytest.mark.parametrize("text, message", [
    ("interval_second = 3", "unknown key interval_second (did you mean 'interval_seconds'?)"),
    ("zzz = 3", ("unknown key zzz (known: interval_seconds, store_dir, retention_days, retention_bytes, "
                 "listen, log_level, allowed_users, max_targets, probes, stacks, detector, targets, alerts, "
                 "receivers, otlp, identity)")),
    ("[stacks]\nrate = 3", "unknown key stacks.rate (did you mean 'rate_hz'?)"),
    ("[probes]\nsyscall = true", "unknown key probes.syscall (did you mean 'syscalls'?)"),
    ('[[targets]]\nname = "a"\npid = 1\nlatncy = {preset = "vllm"}',
     "unknown key targets[0].latncy (did you mean 'latency'?)"),
    ('[[targets]]\nname = "a"\npid = 1\n[targets.latency]\npreset = "vllm"\nurl_ = "http://h/"',
     "unknown key targets[0].latency.url_ (did you mean 'url'?)"),
    ("interval_seconds = 0.5", "interval_seconds: must be within [1, 60], got 0.5"),
    ("interval_seconds = 61", "interval_seconds: must be within [1, 60], got 61.0"),
    ('interval_seconds = "5"', "interval_seconds: expected a number, got '5' (string)"),
    ("interval_seconds = true", "interval_seconds: expected a number, got True (boolean)"),
    ("[stacks]\nrate_hz = 0", "stacks.rate_hz: must be within [1, 1000], got 0"),
    ("[stacks]\nrate_hz = 1001", "stacks.rate_hz: must be within [1, 1000], got 1001"),
    ("[stacks]\nrate_hz = 49.5", "stacks.rate_hz: expected an integer, got 49.5 (float)"),
    ("[stacks]\nsegment_seconds = 0", "stacks.segment_seconds: must be within [1, 60], got 0"),
    ("[stacks]\nsteady_segment_seconds = 61", "stacks.steady_segment_seconds: must be within [1, 60], got 61"),
    ("[stacks]\nsegment_seconds = 2.5", "stacks.segment_seconds: expected an integer, got 2.5 (float)"),
    ("[stacks]\nburst_rate_hz = 1001", "stacks.burst_rate_hz: must be within [1, 1000], got 1001"),
    ("[stacks]\nburst_hold_segments = -1", "stacks.burst_hold_segments: must be within [0, 1000], got -1"),
    ("[stacks]\nburst_max_seconds = 1", "stacks.burst_max_seconds: must be within [5, 86400], got 1.0"),
    ("[stacks]\nburst_rise_windows = 0", "stacks.burst_rise_windows: must be within [1, 1000], got 0"),
    ("[stacks]\nburst_rise_windows = 1.5", "stacks.burst_rise_windows: expected an integer, got 1.5 (float)"),
    ("[stacks]\nburst_max_seconds = nan", "stacks.burst_max_seconds: must be within [5, 86400], got nan"),
    ('[stacks]\nburst_max_seconds = "30"', "stacks.burst_max_seconds: expected a number, got '30' (string)"),
    ('[stacks]\nnonblocking = "yes"', "stacks.nonblocking: expected a boolean, got 'yes' (string)"),
    ("[stacks]\nenabled = 1", "stacks.enabled: expected a boolean, got 1 (integer)"),
    ("stacks = 3", "stacks: expected a table, got 3 (integer)"),
    ("pyspy_rate_hz = 3", "pyspy_rate_hz: renamed to stacks.rate_hz (the rate_hz key of a [stacks] table)"),
    ("pyspy_enabled = false", "pyspy_enabled: renamed to stacks.enabled (the enabled key of a [stacks] table)"),
    ("retention_bytes = 1000", "retention_bytes: must be within [1048576, 1099511627776], got 1000"),
    ("retention_days = 0", "retention_days: must be within [0.01, 3650], got 0.0"),
    ('log_level = "loud"', "log_level: must be one of debug, info, warning, error, got 'loud'"),
    ('listen = "9464"', "listen: must be host:port or [ipv6]:port, got '9464'"),
    ('listen = "127.0.0.1:70000"', "listen: port must be within [1, 65535], got '127.0.0.1:70000'"),
    ('listen = "[1:2:3:4:5:6:7:8:9]:80"', "listen: has an invalid IPv6 address, got '[1:2:3:4:5:6:7:8:9]:80'"),
    ("store_dir = 5", "store_dir: expected a path string, got 5 (integer)"),
    ("probes = 1", "probes: expected a table, got 1 (integer)"),
    ("[probes]\ngc = 1", "probes.gc: expected a boolean, got 1 (integer)"),
    ("targets = []", "targets: must name at least one target, got []"),
    ('allowed_users = ["root", "no-such-user-xq"]', "allowed_users[1]: no such user on this host, got 'no-such-user-xq'"),
    ('allowed_users = "root"', "allowed_users: expected an array of strings, got 'root' (string)"),
    ("max_targets = 0", "max_targets: must be within [1, 1024], got 0"),
    ("targets = 3", "targets: expected an array of tables, got 3 (integer)"),
    ("[[targets]]\npid = 3", "targets[0].name: missing (required)"),
    ('[[targets]]\nname = "a b"\npid = 3', "targets[0].name: must be 1-64 of A-Z a-z 0-9 _ . -, got 'a b'"),
    ('[[targets]]\nname = "a"', "targets[0]: set exactly one of pid, pidfile, process_regex, systemd_unit, "
                                 "cgroup, container, port (got none)"),
    ('[[targets]]\nname = "a"\npid = 3\nprocess_regex = "x"',
     "targets[0]: set exactly one of pid, pidfile, process_regex, systemd_unit, cgroup, container, port "
     "(got pid and process_regex)"),
    ('[[targets]]\nname = "a"\nport = 8000\nsystemd_unit = "vllm.service"',
     "targets[0]: set exactly one of pid, pidfile, process_regex, systemd_unit, cgroup, container, port "
     "(got systemd_unit and port)"),
    ('[[targets]]\nname = "a"\nport = 70000', "targets[0].port: must be within [1, 65535], got 70000"),
    ('[[targets]]\nname = "a"\nport = "8000"', "targets[0].port: expected an integer, got '8000' (string)"),
    ('[[targets]]\nname = "a"\npid = 3\nchildren = "yes"',
     "targets[0].children: expected a boolean, got 'yes' (string)"),
    ('[[targets]]\nname = "a"\ncgroup = "x"\nchildren = false',
     "targets[0].children: cannot be false with cgroup: its family is every process of the cgroup, whoever "
     "their parent"),
    ('[[targets]]\nname = "a"\ncgroup = "system.slice/../x"',
     "targets[0].cgroup: must be a cgroup directory: a path under the cgroup v2 mount or one relative to its "
     "root, without '..', got 'system.slice/../x'"),
    ('[[targets]]\nname = "a"\ncgroup = "/"',
     "targets[0].cgroup: names the root cgroup, which holds every process of the host; name a cgroup below "
     "it, got '/'"),
    ('[[targets]]\nname = "a"\nsystemd_unit = "vllm service"',
     "targets[0].systemd_unit: must be a systemd unit name such as 'vllm.service' (1-255 of A-Z a-z 0-9 : _ . "
     "@ \\ -), got 'vllm service'"),
    ('[[targets]]\nname = "a"\ncontainer = "-abc"',
     "targets[0].container: must be a container id or name prefix (1-128 of A-Z a-z 0-9 _ . -, not starting "
     "with . _ -), got '-abc'"),
    ('[[targets]]\nname = "a"\ncontainer = "abc"\nmax_processes = 0',
     "targets[0].max_processes: must be within [1, 4096], got 0"),
    ('[[targets]]\nname = "a"\ncontainer = "abc"\nmax_processse = 8',
     "unknown key targets[0].max_processse (did you mean 'max_processes'?)"),
    ('[[targets]]\nname = "a"\npid = 0', "targets[0].pid: must be within [1, 4194304], got 0"),
    ('[[targets]]\nname = "a"\npid = "12"', "targets[0].pid: expected an integer, got '12' (string)"),
    ('[[targets]]\nname = "a"\npid = 1\n[[targets]]\nname = "b"\nprocess_regex = "("',
     ("targets[1].process_regex: is not a valid regular expression (missing ), unterminated subpattern "
      "at position 0), got '('")),
    ('[[targets]]\nname = "a"\npid = 1\n[[targets]]\nname = "a"\npid = 2',
     "targets[1].name: duplicates another target's name, got 'a'"),
    (('[[targets]]\nname = "a"\npid = 1\n[[targets]]\nname = "b"\npid = 2\n'
      'latency = {preset = "vllm", url = "ftp://h/m"}'),
     "targets[1].latency.url: must be an http:// or https:// URL with a host, got 'ftp://h/m'"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {metric = "m", url = "ftp://scraper:s3cret@h/m"}',
     "targets[0].latency.url: must be an http:// or https:// URL with a host, got 'ftp://***@h/m'"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {metric = "m", url = "http://scraper:s3cret@h:99999/m"}',
     "targets[0].latency.url: is not a valid URL (bad host or port), got 'http://***@h:99999/m'"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {preset = "sglang"}',
     "targets[0].latency.preset: must be one of tgi, triton, vllm, workload, got 'sglang'"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {metric = "m"}', "targets[0].latency.url: missing (required)"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {url = "http://h/", metric = "m", kind = "summary"}',
     "targets[0].latency.kind: must be one of histogram, counter, got 'summary'"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {url = "http://h/", metric = "m", kind = "counter"}',
     "targets[0].latency.count_metric: is required when kind is 'counter', got None"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {preset = "vllm", timeout_seconds = 0}',
     "targets[0].latency.timeout_seconds: must be within [0.1, 60], got 0.0"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {preset = "vllm", max_body_bytes = 1000}',
     "targets[0].latency.max_body_bytes: must be within [65536, 1073741824], got 1000"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {preset = "vllm", max_body_bytes = "16MiB"}',
     "targets[0].latency.max_body_bytes: expected an integer, got '16MiB' (string)"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {preset = "vllm", max_series = 5_000_000}',
     "targets[0].latency.max_series: must be within [100, 1000000], got 5000000"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {preset = "vllm", max_series = 1.5}',
     "targets[0].latency.max_series: expected an integer, got 1.5 (float)"),
    ('[[targets]]\nname = "a"\npid = 1\nlatency = "vllm"',
     "targets[0].latency: expected a table, got 'vllm' (string)"),
    ("interval_seconds = = 1", "TOML syntax error: Invalid value (at line 1, column 20)"),
    ("[probes\n", "TOML syntax error: Expected ']' at the end of a table declaration (at line 1, column 8)"),
])
def test_each_error_is_one_line_naming_key_and_value(conf_dir: Path, text: str, message: str) -> None:
    assert error_of(conf_dir, text) == message


@pytest.mark.parametrize("key", ["enabled", "rate_hz", "burst_rate_hz", "burst_hold_segments", "segment_seconds",
                                 "nonblocking"])
def test_each_old_pyspy_key_names_its_stacks_key_which_loads(conf_dir: Path, key: str) -> None:
    value = str(getattr(StacksConfig(), key)).lower()
    assert error_of(conf_dir, f"pyspy_{key} = {value}") == (
        f"pyspy_{key}: renamed to stacks.{key} (the {key} key of a [stacks] table)")
    assert load_config(write(conf_dir, f"[stacks]\n{key} = {value}\n")).stacks == StacksConfig()


def test_not_utf8(conf_dir: Path) -> None:
    path = conf_dir / "infersight.toml"
    path.write_bytes(b"log_level = '\xff'\n")
    with pytest.raises(ConfigError, match=r"(TOML syntax error|not UTF-8)"):
        load_config(path)


def test_missing_and_unreadable_file(conf_dir: Path) -> None:
    missing = conf_dir / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(info.value) == f"cannot read config file {str(missing)!r}: No such file or directory"
    with pytest.raises(ConfigError) as info:
        load_config(conf_dir)
    assert str(info.value) == f"refusing config file {str(conf_dir)!r}: it is not a regular file (a directory)"


def test_dataclasses_validate_when_built_directly() -> None:
    with pytest.raises(ConfigError, match=r"^interval_seconds: must be within \[1, 60\], got 0$"):
        Config(interval_seconds=0)
    with pytest.raises(ConfigError, match="set exactly one of"):
        TargetSpec(name="x")
    with pytest.raises(ConfigError, match="must be one of tgi, triton, vllm, workload, got 'nope'"):
        LatencySpec.from_preset("nope")
    assert parse_listen("localhost:1") == ("localhost", 1)


def test_presets_match_what_the_servers_export() -> None:
    assert PRESETS["vllm"].metric == "vllm:e2e_request_latency_seconds"
    assert PRESETS["workload"].metric == PRESETS["vllm"].metric
    assert PRESETS["tgi"].metric == "tgi_request_duration" and PRESETS["tgi"].kind == "histogram"
    tr = PRESETS["triton"]
    assert (tr.kind, tr.unit_seconds, tr.count_metric) == ("counter", 1e-6, "nv_inference_request_success")
    for p in PRESETS.values():
        LatencySpec.from_preset(p.name)  # every preset builds a valid spec


# ---- trust checks: real files first, then an injected stat for owners we cannot create here ----------

def test_world_writable_config_file_is_refused(conf_dir: Path) -> None:
    path = write(conf_dir, "")
    path.chmod(0o666)
    with pytest.raises(UntrustedPath) as info:
        load_config(path)
    assert str(info.value) == (f"refusing config file {str(path)!r}: it is writable by every user (mode 0666); "
                               "a root daemon must not take orders from other users (chown root and chmod go-w)")


def test_config_in_world_writable_dir_is_refused(conf_dir: Path) -> None:
    path = write(conf_dir, "")
    conf_dir.chmod(0o777)
    with pytest.raises(UntrustedPath, match=rf"refusing config file '{path}': '{conf_dir}' is writable by "
                                            r"every user \(mode 0777\)"):
        load_config(path)


def test_group_writable_non_root_group_is_refused(conf_dir: Path) -> None:
    path = write(conf_dir, "")
    path.chmod(0o664)
    load_config(path)  # group root may write: allowed
    os.chown(path, 0, 100)
    with pytest.raises(UntrustedPath, match=r"is writable by group 100 \(mode 0664\)"):
        load_config(path)


def test_file_owned_by_another_user_is_refused(conf_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root (CI runs as root)")
    path = write(conf_dir, "")
    os.chown(path, 65534, 65534)
    with pytest.raises(UntrustedPath, match=r"refusing config file '.*': it is owned by uid 65534"):
        load_config(path)


def test_sticky_parent_is_allowed_but_sticky_final_dir_is_not(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "own").mkdir(mode=0o700)
    check_trusted_path(sticky / "own", what="store directory")
    with pytest.raises(UntrustedPath, match=r"is writable by every user \(mode 1777\)"):
        check_trusted_path(sticky, what="store directory")


def test_symlink_is_followed_and_its_target_checked(conf_dir: Path, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "real.toml").write_text("")
    (open_dir / "real.toml").chmod(0o644)
    link = conf_dir / "infersight.toml"
    link.symlink_to(open_dir / "real.toml")
    with pytest.raises(UntrustedPath, match=rf"'{open_dir}' is writable by every user"):
        load_config(link)
    good = conf_dir / "good.toml"
    good.write_text("")
    (conf_dir / "rel.toml").symlink_to("good.toml")
    assert load_config(conf_dir / "rel.toml") == Config()



def test_config_file_replaced_after_the_check_is_refused(require_root, tmp_path: Path) -> None:
    # Fails before open_trusted: the path was checked, then whatever was there at open() was read.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    path = sticky / "infersight.toml"
    path.write_text("")

    def stat(p: str) -> os.stat_result:
        st = os.lstat(p)
        if p == str(path):  # another user, right after the check
            path.unlink()
            path.write_text('listen = "0.0.0.0:9464"\n')
            os.chown(path, 65534, 65534)
        return st

    with pytest.raises(UntrustedPath, match=rf"refusing config file '{path}': it is owned by uid 65534"):
        load_config(path, stat=stat)

def test_missing_tail_passes_when_existing_parent_is_trusted(conf_dir: Path) -> None:
    check_trusted_path(conf_dir / "a" / "b", what="store directory")


class FakeFs:
    """An injected stat/readlink over a dict: {path: (mode, uid, gid)} and {link: target}."""

    def __init__(self, entries: dict[str, tuple[int, int, int]], links: dict[str, str] | None = None) -> None:
        self.entries, self.links = entries, links or {}

    def stat(self, path: str) -> os.stat_result:
        if path in self.links:
            return os.stat_result((stat_mod.S_IFLNK | 0o777, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        if path not in self.entries:
            raise FileNotFoundError(2, "No such file or directory", path)
        mode, uid, gid = self.entries[path]
        return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))

    def readlink(self, path: str) -> str:
        return self.links[path]


D, F = stat_mod.S_IFDIR, stat_mod.S_IFREG


def test_injected_stat_parent_owned_by_user_is_refused() -> None:
    fs = FakeFs({"/": (D | 0o755, 0, 0), "/home": (D | 0o755, 0, 0), "/home/bob": (D | 0o755, 1000, 1000),
                 "/home/bob/i.toml": (F | 0o644, 0, 0)})
    with pytest.raises(UntrustedPath, match=r"'/home/bob' is owned by uid 1000"):
        check_trusted_path(Path("/home/bob/i.toml"), what="config file", stat=fs.stat, readlink=fs.readlink,
                           trusted_uids=frozenset({0}))


def test_injected_stat_symlink_owned_by_user_and_dotdot() -> None:
    fs = FakeFs({"/": (D | 0o755, 0, 0), "/etc": (D | 0o755, 0, 0), "/etc/i.toml": (F | 0o600, 0, 0),
                 "/run": (D | 0o755, 0, 0)}, links={"/run/x.toml": "../etc/i.toml"})
    check_trusted_path(Path("/run/x.toml"), what="config file", stat=fs.stat, readlink=fs.readlink,
                       trusted_uids=frozenset({0}))

    def user_link(path: str) -> os.stat_result:
        st = fs.stat(path)
        return os.stat_result((st.st_mode, 0, 0, 1, 1000, 0, 0, 0, 0, 0)) if path == "/run/x.toml" else st

    with pytest.raises(UntrustedPath, match=r"symlink '/run/x.toml' is owned by uid 1000"):
        check_trusted_path(Path("/run/x.toml"), what="pidfile", stat=user_link, readlink=fs.readlink,
                           trusted_uids=frozenset({0}))


def test_injected_stat_symlink_loop() -> None:
    fs = FakeFs({"/": (D | 0o755, 0, 0)}, links={"/a": "/b", "/b": "/a"})
    with pytest.raises(UntrustedPath, match="too many symbolic links"):
        check_trusted_path(Path("/a"), what="config file", stat=fs.stat, readlink=fs.readlink)


def test_check_config_paths_names_the_store_dir_or_pidfile(tmp_path: Path) -> None:
    safe, open_dir = tmp_path / "safe", tmp_path / "open"
    safe.mkdir(mode=0o755)
    open_dir.mkdir()
    open_dir.chmod(0o777)
    target = TargetSpec(name="t", pidfile=safe / "t.pid")
    check_config_paths(Config(store_dir=safe / "store", targets=(target,)))
    with pytest.raises(UntrustedPath, match=rf"refusing store directory '{open_dir}/store': '{open_dir}' is "):
        check_config_paths(Config(store_dir=open_dir / "store", targets=(target,)))
    bad = TargetSpec(name="t", pidfile=open_dir / "t.pid")
    with pytest.raises(UntrustedPath, match=rf"refusing pidfile '{open_dir}/t.pid': '{open_dir}' is writable"):
        check_config_paths(Config(store_dir=safe / "store", targets=(bad,)))


@pytest.mark.parametrize(("text", "key"), [
    ('[[targets]]\nname = "a"\npid = 1\nlatency = {metric = "m", url = "http://scraper:s3cret@h/m"}',
     "targets[0].latency.url"),
    ('[[receivers]]\nname = "s"\nkind = "slack"\nurl = "https://hooks.slack.com/services/T0/B0/s3cret"',
     "receivers[0].url"),
    ('[[receivers]]\nname = "w"\nurl = "https://h/hook?token=s3cret"', "receivers[0].url"),
    ('[[receivers]]\nname = "w"\nurl = "https://h/hook"\nheaders = { Authorization = "Bearer s3cret" }',
     "receivers[0].headers"),
])
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_config_holding_a_credential_must_not_be_readable_by_others(conf_dir: Path, text: str, key: str,
                                                                      mode: int) -> None:
    path = write(conf_dir, text)
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}: {key}: holds a credential, but the file is readable by other users "
                               f"(mode {mode:04o}); chmod 600 {path}")
    assert "s3cret" not in str(info.value)
    path.chmod(0o600)
    assert load_config(path) is not None


def test_a_config_without_credentials_may_stay_world_readable(conf_dir: Path) -> None:
    path = write(conf_dir, '[[receivers]]\nname = "w"\nurl = "https://h/hook"\n'
                           '[[targets]]\nname = "a"\npid = 1\nlatency = {metric = "m", url = "http://h:9/m"}')
    assert load_config(path).receivers[0].url == "https://h/hook"


def test_family_selectors_load_with_their_children_defaults(conf_dir: Path) -> None:
    """The old selectors stay single-process unless `children = true`; the new ones are families by default."""
    path = conf_dir / "families.toml"
    path.write_text('[[targets]]\nname = "old"\nprocess_regex = "vllm serve"\n'
                    '[[targets]]\nname = "folded"\nprocess_regex = "vllm serve"\nchildren = true\n'
                    '[[targets]]\nname = "unit"\nsystemd_unit = "vllm"\nmax_processes = 8\n'
                    '[[targets]]\nname = "cg"\ncgroup = "system.slice/x.service"\n'
                    '[[targets]]\nname = "ctr"\ncontainer = "3f2a"\n'
                    '[[targets]]\nname = "port"\nport = 8000\n'
                    '[[targets]]\nname = "listener"\nport = 8001\nchildren = false\n')
    targets = {t.name: t for t in load_config(path).targets}
    assert {n: (t.selector, t.family) for n, t in targets.items()} == {
        "old": ("process_regex", False), "folded": ("process_regex", True), "unit": ("systemd_unit", True),
        "cg": ("cgroup", True), "ctr": ("container", True), "port": ("port", True), "listener": ("port", False)}
    assert targets["unit"].unit_name == "vllm.service" and targets["unit"].max_processes == 8
    assert targets["old"].max_processes == 64
    assert TargetSpec(name="s", systemd_unit="job.scope").unit_name == "job.scope"
