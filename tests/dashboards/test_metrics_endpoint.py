"""/metrics exposes per-target probe series and the agent's own health in Prometheus text format."""

from prometheus_client.parser import text_string_to_metric_families


def _samples(client):
    text = client.get("/metrics").get_data(as_text=True)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_probe_series_for_the_target(client):
    s = _samples(client)
    assert s[("infersight_syscalls_total", (("syscall", "futex"), ("target", "server")))] == 120
    assert s[("infersight_offcpu_seconds_total", (("target", "server"),))] == 2.5
    assert s[("infersight_gc_collections_total", (("target", "server"),))] == 3
    assert s[("infersight_tcp_retransmits_total", (("target", "server"),))] == 2
    assert s[("infersight_request_latency_seconds", (("percentile", "p99"), ("target", "server")))] == 0.12


def test_histograms_are_cumulative_in_seconds(client):
    s = _samples(client)
    # 3 GC pauses in the [4096, 8192) us slot: the le=0.008192 s bucket holds them, le=0.004096 does not.
    assert s[("infersight_gc_pause_seconds_bucket", (("le", "0.004096"), ("target", "server")))] == 0
    assert s[("infersight_gc_pause_seconds_bucket", (("le", "0.008192"), ("target", "server")))] == 3
    assert s[("infersight_gc_pause_seconds_bucket", (("le", "+Inf"), ("target", "server")))] == 3
    assert s[("infersight_runqueue_latency_seconds_count", (("target", "server"),))] == 17


def test_agent_health_series(client):
    s = _samples(client)
    assert s[("infersight_agent_windows_total", ())] == 1
    assert s[("infersight_agent_cpu_seconds_total", ())] > 0
    assert s[("infersight_agent_resident_memory_bytes", ())] > 10 * 2**20
    assert s[("infersight_source_up", (("source", "syscalls"),))] == 1
    assert s[("infersight_source_up", (("source", "gc"),))] == 0

def test_agent_errors_count_its_own_failures_and_missing_readings_are_apart(client, state):
    s = _samples(client)
    # The window lacks stacks (py-spy exited): a missing reading, not a failure of the agent's own work.
    assert s[("infersight_window_missing_readings_total", (("source", "stacks"),))] == 1
    assert s[("infersight_window_missing_readings_total", (("source", "gc"),))] == 0
    assert ("infersight_agent_errors_total", (("component", "stacks"),)) not in s
    assert s[("infersight_agent_errors_total", (("component", "store"),))] == 0  # exists before the first failure
    state.count_error("store")
    assert _samples(client)[("infersight_agent_errors_total", (("component", "store"),))] == 1


def test_a_source_that_never_measured_a_target_exports_no_series_for_it_never_a_zero(bare_client):
    """`native` has no gc (not Python), no tcp (switched off), no run-queue (failed), no latency source."""
    s = _samples(bare_client)
    native = {(name, labels) for name, labels in s if ("target", "native") in labels}
    assert ("infersight_syscalls_total", (("syscall", "read"), ("target", "native"))) in native
    assert ("infersight_offcpu_seconds_total", (("target", "native"),)) in native
    assert ("infersight_process_cpu_seconds_total", (("target", "native"),)) in native
    absent = ("infersight_gc_collections_total", "infersight_gc_pause_seconds_count", "infersight_tcp_retransmits_total",
              "infersight_runqueue_latency_seconds_count", "infersight_requests_total",
              "infersight_request_latency_seconds", "infersight_request_rate_per_second")
    assert [(n, labels) for n, labels in native if n in absent] == []


def test_a_family_exports_its_processes_by_role_capped_and_never_a_zero_for_what_a_role_did_not_measure():
    from agent.metrics import build_registry
    from agent.state import AgentState
    from analysis.snapshot import MAX_PROCESS_LABELS, OTHER_PROCESSES
    from analysis.window import MemberReading
    from dashboards.app import create_app
    from tests.dashboards.conftest import make_window

    state = AgentState()
    for start in (1000.0, 1005.0):
        w = make_window(target="vllm", start=start, end=start + 5)
        w.members = [MemberReading(pid=10, role="vllm serve", cpu_seconds=0.5, rss_bytes=100),
                     MemberReading(pid=11, role="VLLM::EngineCore", cpu_seconds=2.0, gc_collections=4,
                                   gc_pause_seconds=0.25, rss_bytes=300),
                     *[MemberReading(pid=100 + i, role=f"worker-{i}", cpu_seconds=0.1) for i in range(40)]]
        state.record_window(w)
    s = _samples(create_app({"STATE": state, "REGISTRY": build_registry(state), "TESTING": True}).test_client())
    engine = (("process", "VLLM::EngineCore"), ("target", "vllm"))
    api = (("process", "vllm serve"), ("target", "vllm"))
    assert s[("infersight_member_cpu_seconds_total", engine)] == 4.0
    assert s[("infersight_member_gc_collections_total", engine)] == 8
    assert s[("infersight_member_gc_pause_seconds_total", engine)] == 0.5
    assert s[("infersight_member_resident_memory_bytes", engine)] == 300  # the latest window's, not a sum over time
    assert s[("infersight_member_processes", api)] == 1
    # The API process measured no GC: no series, never 0.
    assert ("infersight_member_gc_collections_total", api) not in s
    roles = {dict(labels)["process"] for name, labels in s if name == "infersight_member_processes"}
    assert len(roles) == MAX_PROCESS_LABELS + 1 and OTHER_PROCESSES in roles
    other = (("process", OTHER_PROCESSES), ("target", "vllm"))
    assert s[("infersight_member_processes", other)] == 42 - MAX_PROCESS_LABELS
    assert not any("pid" in dict(labels) for _, labels in s if _.startswith("infersight_member"))


def test_a_host_without_a_gpu_has_no_source_up_series_for_it(state, client):
    from analysis.health import Health

    state.set_health("gpu:server", Health(name="gpu", state="absent", reason="no GPU on this host"))
    state.set_health("gpu:other", Health(name="gpu", state="failed", reason="cannot read the GPU"))
    s = _samples(client)
    # No series, so no InferenceSourceDown alert for a host that simply has no GPU; a broken one is down.
    assert not any(name == "infersight_source_up" and ("source", "gpu:server") in labels for name, labels in s)
    assert s[("infersight_source_up", (("source", "gpu:other"),))] == 0


def test_client_latency_is_exported_only_when_server_latency_and_delivery_were_both_measured(client):
    from agent.metrics import build_registry
    from agent.state import AgentState
    from analysis.window import DeliveryReading, LatencyReading
    from dashboards.app import create_app
    from tests.dashboards.conftest import make_window

    # make_window's server has no delivery reading: no client series, never a zero.
    assert not [k for k in _samples(client) if k[0] == "infersight_client_latency_seconds"]
    state = AgentState()
    w = make_window()
    w.latency = LatencyReading(p50_seconds=0.05, p99_seconds=0.1, requests=100,
                               buckets={"0.05": 50.0, "0.1": 50.0, "0.5": 0.0, "+Inf": 0.0})
    # A fifth of the replies reached their clients after an RTO (0.2-0.5 s).
    w.delivery = DeliveryReading(replies=100, retransmitted=20,
                                 buckets={"0.05": 80.0, "0.1": 0.0, "0.5": 20.0, "+Inf": 0.0})
    state.record_window(w)
    s = _samples(create_app({"STATE": state, "REGISTRY": build_registry(state), "TESTING": True}).test_client())
    p99 = s[("infersight_client_latency_seconds", (("percentile", "p99"), ("target", "server")))]
    p50 = s[("infersight_client_latency_seconds", (("percentile", "p50"), ("target", "server")))]
    assert 0.4 < p99 <= 0.6 and p50 < 0.15
