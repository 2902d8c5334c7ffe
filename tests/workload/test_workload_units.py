"""Pure pieces: request validation, nft rule text, fault set bookkeeping, metric names."""

import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from workload.api import BadRequest, Limits, parse_completion
from workload.faults import FaultSet, LockHolder, UnknownFault
from workload.metrics import create_metrics
from workload.netloss import Netloss, NetlossError, ruleset, table_name

LIMITS = Limits(max_prompt_bytes=100, max_seq=128)


def test_parse_completion_defaults_and_limits() -> None:
    parsed = parse_completion({"prompt": "hi"}, LIMITS)
    assert (parsed.max_tokens, parsed.temperature, parsed.seed, parsed.stream) == (16, 1.0, None, False)
    assert parse_completion({"prompt": ["one"], "max_tokens": 124}, LIMITS).max_tokens == 124
    with pytest.raises(BadRequest, match="1..124 .* 125"):
        parse_completion({"prompt": "one", "max_tokens": 125}, LIMITS)
    with pytest.raises(BadRequest, match="True"):
        parse_completion({"prompt": "x", "seed": True}, LIMITS)


def test_ruleset_targets_the_port_both_ways() -> None:
    text = ruleset(8123, 25)
    assert f"table inet {table_name(8123)}" in text
    assert text.count("tcp dport 8123 numgen random mod 100 < 25 counter drop") == 2
    assert text.count("tcp sport 8123") == 2
    with pytest.raises(ValueError, match="0"):
        ruleset(0, 25)
    with pytest.raises(ValueError, match="100"):
        Netloss(8123, percent=100)


def test_netloss_reports_nft_errors_and_reads_counters() -> None:
    calls = []

    def runner(args, stdin):
        calls.append(list(args))
        if args[0] == "list":
            return subprocess.CompletedProcess(args, 0, "tcp dport 1 counter packets 7 bytes 1 drop\n"
                                                        "tcp sport 1 counter packets 5 bytes 1 drop\n", "")
        if args[0] == "-f":
            return subprocess.CompletedProcess(args, 1, "", "Error: Could not process rule: Permission denied")
        return subprocess.CompletedProcess(args, 0, "", "")

    loss = Netloss(9000, runner=runner)
    with pytest.raises(NetlossError, match="Permission denied"):
        loss.on()
    assert loss.dropped_packets() == 12
    assert ["delete", "table", "inet", table_name(9000)] in calls


def test_fault_set_tracks_state_and_rejects_unknown_names() -> None:
    events = []

    class Flag:
        value = False

        def on(self):
            self.value = True

        def off(self):
            self.value = False

    flag = Flag()
    faults = FaultSet({"flag": flag}, on_change=lambda n, a: events.append((n, a)))
    faults.set("flag", True)
    assert flag.value and faults.active() == {"flag": True}
    faults.all_off()
    assert not flag.value and events == [("flag", True), ("flag", False)]
    with pytest.raises(UnknownFault, match="'nope'"):
        faults.set("nope", True)


def test_lock_holder_validates_its_duty_cycle() -> None:
    import threading
    with pytest.raises(ValueError, match="hold_s=0.5"):
        LockHolder(threading.Lock(), 0.5, 0.1)


def test_metrics_use_vllm_names_on_the_given_registry() -> None:
    registry = CollectorRegistry()
    metrics = create_metrics(registry, "m")
    metrics.e2e.labels("m").observe(0.2)
    metrics.prompt_tokens.labels("m").inc(3)
    text = generate_latest(registry).decode()
    for name in ("vllm:e2e_request_latency_seconds_bucket", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:time_per_output_token_seconds_bucket", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "workload_batch_size_bucket", "vllm:iteration_tokens_total_bucket"):
        assert name in text, name
    assert 'vllm:prompt_tokens_total{model_name="m"} 3.0' in text
    # Nothing leaked into the default registry at import or creation.
    from prometheus_client import REGISTRY
    assert "vllm:e2e_request_latency_seconds" not in generate_latest(REGISTRY).decode()
