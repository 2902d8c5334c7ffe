"""The server as a real subprocess: API, streaming concurrency, metrics, bad requests, queue bound."""

import http.client
import json
import signal
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from workload import tokenizer
from workload.client import ClientError, admin_call, complete, debug, set_fault
from workload.config import preset
from workload.engine import Engine, generate
from workload.faults import FAULT_NAMES

pytestmark = pytest.mark.workload


def post_raw(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body, headers or {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"{}")
    finally:
        conn.close()


def get_json(url: str, path: str) -> tuple[int, dict]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def metrics_text(url: str) -> str:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name!r} not found")


def test_health_pidfile_and_url(server) -> None:
    status, body = get_json(server.url, "/health")
    assert status == 200 and body["status"] == "ok" and body["pid"] == server.pid
    assert server.pidfile.read_text().strip() == str(server.pid)


def test_concurrent_streaming_clients_get_their_own_tokens(server) -> None:
    prompts = [f"client {i} asks about kv caches" * (1 + i % 3) for i in range(8)]
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = complete(server.url, prompts[i], 20, temperature=0.8, seed=100 + i, stream=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    engine = Engine(preset("tiny"), n_slots=1)
    for i, prompt in enumerate(prompts):
        result = results[i]
        assert result.ok, result.error
        assert result.ttft_s is not None and result.ttft_s <= result.latency_s
        expected = generate(engine, [tokenizer.encode(prompt)], 20, 0.8, seed=100 + i)[0]
        assert result.token_ids == expected, f"client {i} got another sequence's tokens"


def test_batching_happened_and_metrics_use_vllm_names(server) -> None:
    before = metrics_text(server.url)
    threads = [threading.Thread(target=complete, args=(server.url, "batch me", 30)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    after = metrics_text(server.url)
    for name in ("vllm:e2e_request_latency_seconds_count", "vllm:time_to_first_token_seconds_count",
                 "vllm:time_per_output_token_seconds_count"):
        assert sample(after, name) - sample(before, name) == 6
    generated = sample(after, "vllm:generation_tokens_total") - sample(before, "vllm:generation_tokens_total")
    assert generated == 6 * 30
    prompt = sample(after, "vllm:prompt_tokens_total") - sample(before, "vllm:prompt_tokens_total")
    assert prompt == 6 * len(tokenizer.encode("batch me"))
    steps = sample(after, "workload_batch_size_count") - sample(before, "workload_batch_size_count")
    tokens_in_steps = sample(after, "workload_batch_size_sum") - sample(before, "workload_batch_size_sum")
    assert tokens_in_steps == 6 * 30
    assert steps < 6 * 30, "six concurrent requests never shared a decode step"
    # Each request is prefilled once (its 9 prompt tokens) and then decoded one token per step.
    iteration = sample(after, "vllm:iteration_tokens_total_sum") - sample(before, "vllm:iteration_tokens_total_sum")
    assert iteration == 6 * (len(tokenizer.encode("batch me")) + 29)
    assert sample(after, "vllm:num_requests_running") == 0
    assert sample(after, "vllm:num_requests_waiting") == 0


def test_non_streaming_response_is_openai_shaped(server) -> None:
    status, _, body = post_raw(server.url, json.dumps({"prompt": "hi", "max_tokens": 5, "seed": 1}).encode())
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"prompt": "x", "max_tokens": -1}).encode(), "-1"),
    (json.dumps({"prompt": "x", "max_tokens": 10**9}).encode(), "1000000000"),
    (json.dumps({"prompt": "x", "max_tokens": "5"}).encode(), "'5'"),
    (json.dumps({"prompt": "x" * 5000, "max_tokens": 5}).encode(), "5000 bytes"),
    (json.dumps({"prompt": 7}).encode(), "int"),
    (json.dumps({"prompt": "x", "temperature": -1}).encode(), "-1"),
    (json.dumps({"prompt": "x", "stream": "yes"}).encode(), "'yes'"),
])
def test_bad_requests_get_a_clear_400(server, body: bytes, fragment: str) -> None:
    status, _, payload = post_raw(server.url, body)
    assert status == 400
    assert fragment in payload["error"]["message"]
    assert complete(server.url, "still serving", 3).ok


def test_client_disconnect_mid_stream_frees_the_slot(server) -> None:
    parts = urlsplit(server.url)
    for _ in range(3):
        sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        body = json.dumps({"prompt": "hang up on me", "max_tokens": 400, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        received = b""
        while b"data: " not in received:  # headers and the first event may come in separate reads
            chunk = sock.recv(4096)
            assert chunk, f"server closed before the first event: {received!r}"
            received += chunk
        sock.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = debug(server.url, server.token)
        if state["kv_pool"]["free"] == state["kv_pool"]["slots"]:
            break
        time.sleep(0.2)
    assert state["kv_pool"]["free"] == state["kv_pool"]["slots"], state
    assert complete(server.url, "after the hang-ups", 4).ok


def test_admin_needs_the_token(server) -> None:
    with pytest.raises(ClientError) as wrong:
        set_fault(server.url, "gc", True, "not-the-token")
    assert wrong.value.status == 401
    with pytest.raises(ClientError) as unknown:
        set_fault(server.url, "meteor", True, server.token)
    assert unknown.value.status == 404 and "meteor" in str(unknown.value)
    assert admin_call(server.url, "GET", "/admin/faults", server.token) == {
        name: False for name in FAULT_NAMES}


def test_admin_disabled_without_a_token(server_factory) -> None:
    open_server = server_factory("--admin-token", "")
    with pytest.raises(ClientError) as refused:
        set_fault(open_server.url, "gc", True, "")
    assert refused.value.status == 403 and "--admin-token" in str(refused.value)


def test_full_queue_answers_429_with_retry_after(server_factory) -> None:
    small = server_factory("--max-batch", "1", "--max-waiting", "2")
    statuses: list[int] = []
    retry_after: list[str | None] = []
    lock = threading.Lock()

    def run() -> None:
        status, headers, _ = post_raw(small.url, json.dumps({"prompt": "q", "max_tokens": 200}).encode())
        with lock:
            statuses.append(status)
            retry_after.append(headers.get("Retry-After"))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert statuses.count(200) >= 3
    assert 429 in statuses
    assert all(r == "1" for s, r in zip(statuses, retry_after) if s == 429)
    assert complete(small.url, "queue drained", 3).ok
    rejected = [line for line in metrics_text(small.url).splitlines()
                if line.startswith("workload_requests_rejected_total") and 'reason="queue_full"' in line]
    assert rejected and float(rejected[0].rsplit(" ", 1)[1]) == statuses.count(429)


def test_sigterm_cleans_up_pidfile(server_factory) -> None:
    doomed = server_factory()
    assert doomed.pidfile.exists()
    doomed.proc.send_signal(signal.SIGTERM)
    assert doomed.proc.wait(15) == 0
    assert not doomed.pidfile.exists(), "pidfile left behind after SIGTERM"
