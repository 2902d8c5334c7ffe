"""`serve --engine-process`: the engine in a titled child over ZeroMQ, faults in the process chosen, restarts."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.workload.conftest import REPO, start_server, stop_server
from tests.workload.test_workload_faults import burst, proc_io_syscr, proc_io_wchar
from tests.workload.test_workload_server import get_json, metrics_text, sample
from workload import tokenizer
from workload.client import ClientError, complete, debug, kill_engine, set_fault
from workload.engine_protocol import ENGINE_TITLE
from workload.faults import FaultTuning

pytestmark = pytest.mark.workload
STEPS = 40
# Generous: a loaded 2-core host starts a torch process in seconds, sometimes tens of them.
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    started = start_server(tmp_path_factory.mktemp("split"), "--engine-process")
    yield started
    stop_server(started.proc)


def wait_for(check: Callable[[], object], what: str, deadline_s: float = DEADLINE_S) -> object:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {deadline_s:.0f}s")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def engine_pid(server) -> int:
    return debug(server.url, server.token)["engine_pid"]


def test_same_tokens_as_single_process(split, server_factory) -> None:
    single = server_factory()
    cases = [(f"prompt {i} about batching" * (1 + i % 3), 24, 0.0 if i % 2 else 0.8, 500 + i, i % 3 != 0)
             for i in range(6)]

    def run(url: str) -> list[list[int]]:
        results: list = [None] * len(cases)

        def one(i: int) -> None:
            prompt, tokens, temperature, seed, stream = cases[i]
            results[i] = complete(url, prompt, tokens, temperature=temperature, seed=seed, stream=stream,
                                  timeout=DEADLINE_S)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_S + 30)
        assert all(r is not None and r.ok for r in results), [r and r.error for r in results]
        return [r.token_ids for r in results]

    expected = run(single.url)
    assert run(split.url) == expected
    assert all(len(ids) == 24 for ids in expected)


def test_streaming_is_token_by_token(split) -> None:
    parts = urlsplit(split.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    body = json.dumps({"prompt": "one at a time", "max_tokens": 12, "stream": True, "temperature": 0}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while b"data: [DONE]" not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    sock.close()
    chunks = [json.loads(line[6:]) for line in received.decode().splitlines()
              if line.startswith("data: {")]
    assert [len(c["choices"][0].get("token_ids", [])) for c in chunks] == [1] * 12 + [0]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_metrics_keep_vllm_names_and_count_every_request(split) -> None:
    before = metrics_text(split.url)
    threads = [threading.Thread(target=complete, args=(split.url, "batch me", 30)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    after = metrics_text(split.url)
    for name in ("vllm:e2e_request_latency_seconds_count", "vllm:time_to_first_token_seconds_count",
                 "vllm:time_per_output_token_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count"):
        assert sample(after, name) - sample(before, name) == 6, name
    assert sample(after, "vllm:generation_tokens_total") - sample(before, "vllm:generation_tokens_total") == 180
    prompt = sample(after, "vllm:prompt_tokens_total") - sample(before, "vllm:prompt_tokens_total")
    assert prompt == 6 * len(tokenizer.encode("batch me"))
    # The engine's split of each request adds up to the latency it measured, as in one process.
    parts = sum(sample(after, f"vllm:request_{p}_time_seconds_sum") - sample(before, f"vllm:request_{p}_time_seconds_sum")
                for p in ("queue", "prefill", "decode"))
    e2e = sample(after, "vllm:e2e_request_latency_seconds_sum") - sample(before, "vllm:e2e_request_latency_seconds_sum")
    assert parts == pytest.approx(e2e, rel=1e-6)
    assert sample(after, "workload_engine_restarts_total") == 0
    assert sample(after, "vllm:num_requests_running") == 0


def test_engine_is_a_titled_child_process(split) -> None:
    state = debug(split.url, split.token)
    child = state["engine_pid"]
    assert child != split.pid and state["pid"] == split.pid
    assert state["engine"]["pid"] == child
    assert parent_of(child) == split.pid
    cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode().strip()
    assert cmdline == ENGINE_TITLE
    assert ENGINE_TITLE not in Path(f"/proc/{split.pid}/cmdline").read_bytes().decode()
    # The scheduler thread lives in the child; the API process has the output thread instead.
    assert Path(f"/proc/{child}/task/{state['engine']['scheduler_tid']}").exists()
    assert Path(f"/proc/{split.pid}/task/{state['output_tid']}").exists()
    assert get_json(split.url, "/health") == (200, {"status": "ok", "model": "infersight-tiny", "pid": split.pid})


def bound_unix_paths(pid: int) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    inodes = {link[len("socket:["):-1] for link in (os.readlink(fd) for fd in fds.iterdir())
              if link.startswith("socket:[")}
    rows = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
    return [row[7] for row in rows if len(row) >= 8 and row[6] in inodes]


def test_the_engine_channel_is_closed_to_other_users(split) -> None:
    # Requests in, outputs back (each listed for the bound socket and the accepted connection).
    paths = sorted({Path(p) for p in bound_unix_paths(split.pid) if "workload-engine-" in p})
    assert [p.name for p in paths] == ["engine1-in", "engine1-out"], paths
    folder = paths[0].parent
    assert paths[1].parent == folder
    assert folder.stat().st_mode & 0o777 == 0o700 and folder.stat().st_uid == os.getuid()


def test_client_hang_up_frees_the_engine_slot(split) -> None:
    parts = urlsplit(split.url)
    for _ in range(3):
        sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        body = json.dumps({"prompt": "hang up on me", "max_tokens": 400, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        received = b""
        while b"data: " not in received:
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
        sock.close()

    def all_free() -> bool:
        pool = debug(split.url, split.token)["engine"]["kv_pool"]
        return pool["free"] == pool["slots"]

    wait_for(all_free, "the engine freed the slots of the clients that left")
    assert complete(split.url, "after the hang-ups", 4).ok


@pytest.fixture
def placed(split):
    switched: list[tuple[str, str]] = []

    def toggle(name: str, on: bool, place: str) -> None:
        set_fault(split.url, name, on, split.token, place)
        switched.append((name, place))

    yield toggle
    for name, place in switched:
        set_fault(split.url, name, False, split.token, place)


def pids(split) -> dict[str, int]:
    return {"api": split.pid, "engine": engine_pid(split)}


@pytest.mark.parametrize("place", ["engine", "api"])
def test_gc_fault_churns_the_process_chosen(split, placed, place: str) -> None:
    def gen0() -> dict[str, int]:
        state = debug(split.url, split.token)
        return {"api": state["gc"]["collections"][0], "engine": state["engine"]["gc"]["collections"][0]}

    placed("gc", True, place)
    before = gen0()
    burst(split.url)
    after = gen0()
    grew = {p: after[p] - before[p] for p in after}
    other = "api" if place == "engine" else "engine"
    # 4000 cycles x 3 containers per token, gen0 threshold 700: >= 10 collections per token where the fault is.
    assert grew[place] >= 10 * STEPS, grew
    assert grew[other] < 2 * STEPS, grew


@pytest.mark.parametrize("place", ["engine", "api"])
def test_syscall_and_io_faults_run_in_the_process_chosen(split, placed, place: str) -> None:
    where = pids(split)
    other = "api" if place == "engine" else "engine"
    tuning = FaultTuning()
    placed("syscall", True, place)
    placed("io", True, place)
    reads_before = {p: proc_io_syscr(pid) for p, pid in where.items()}
    writes_before = {p: proc_io_wchar(pid) for p, pid in where.items()}
    burst(split.url)
    reads = {p: proc_io_syscr(pid) - reads_before[p] for p, pid in where.items()}
    writes = {p: proc_io_wchar(pid) - writes_before[p] for p, pid in where.items()}
    assert reads[place] >= 0.9 * tuning.syscalls_per_sequence * STEPS, reads
    assert reads[other] < 0.1 * tuning.syscalls_per_sequence * STEPS, reads
    assert writes[place] >= 0.9 * tuning.io_write_bytes * STEPS, writes
    assert writes[other] < 0.1 * tuning.io_write_bytes * STEPS, writes


@pytest.mark.parametrize("place", ["engine", "api"])
def test_lock_and_cpuhog_faults_run_in_the_process_chosen(split, placed, place: str) -> None:
    def waits() -> dict[str, float]:
        state = debug(split.url, split.token)
        return {"api": state["lock_wait_seconds"], "engine": state["engine"]["lock_wait_seconds"]}

    placed("lock", True, place)
    before = waits()
    burst(split.url, tokens=160)
    waited = {p: w - before[p] for p, w in waits().items()}
    other = "api" if place == "engine" else "engine"
    # In the API process the holder delays the delivery of outputs the engine goes on making: fewer waits than in
    # the engine, where each one stalls the next step, but each up to 40 ms; the other process waits for nothing.
    assert waited[place] > 0.08 and waited[other] < 0.03, waited
    placed("cpuhog", True, place)
    state = debug(split.url, split.token)
    hogs = state["cpuhog_pids"] if place == "api" else state["engine"]["cpuhog_pids"]
    # Listed by the process chosen, and not its children: a neighbour's processes, not the server's own work.
    assert hogs and not {parent_of(h) for h in hogs} & set(pids(split).values())
    assert not (state["engine"]["cpuhog_pids"] if place == "api" else state["cpuhog_pids"])
    set_fault(split.url, "cpuhog", False, split.token, place)
    wait_for(lambda: not any(alive(h) for h in hogs), "hogs ended when switched off", 30)


def test_nocache_lives_in_the_engine_only(split, placed) -> None:
    placed("nocache", True, "engine")
    assert debug(split.url, split.token)["engine"]["use_cache"] is False
    with pytest.raises(ClientError) as refused:
        set_fault(split.url, "nocache", True, split.token, "api")
    assert refused.value.status == 400 and "engine" in str(refused.value)


def test_in_is_refused_without_engine_process(server_factory) -> None:
    single = server_factory()
    cli = subprocess.run([sys.executable, "-m", "workload", "fault", "gc", "on", "--in", "engine", "--url",
                          single.url, "--token", single.token], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=False)
    assert cli.returncode == 1 and "400" in cli.stderr and "--engine-process" in cli.stderr, cli.stderr
    assert debug(single.url, single.token)["faults"]["gc"] is False
    bad = subprocess.run([sys.executable, "-m", "workload", "fault", "gc", "on", "--in", "foo", "--url",
                          single.url, "--token", single.token], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "invalid choice: 'foo'" in bad.stderr, bad.stderr
    with pytest.raises(ClientError) as no_engine:
        kill_engine(single.url, single.token)
    assert no_engine.value.status == 400 and "--engine-process" in str(no_engine.value)


def test_bad_in_over_http_is_a_clear_400(split) -> None:
    with pytest.raises(ClientError) as refused:
        set_fault(split.url, "gc", True, split.token, "gpu")
    assert refused.value.status == 400 and "'gpu'" in str(refused.value) and "api, engine" in str(refused.value)


@pytest.mark.parametrize("how", ["outside SIGKILL", "admin switch"])
def test_a_dead_engine_fails_its_requests_and_is_restarted(server_factory, how: str) -> None:
    server = server_factory("--engine-process")
    first = engine_pid(server)
    set_fault(server.url, "gc", True, server.token)
    reference = complete(server.url, "the same again", 8, temperature=0.0)
    assert reference.ok
    in_flight: list = []
    streaming = threading.Thread(target=lambda: in_flight.append(
        complete(server.url, "a long answer", 400, timeout=DEADLINE_S)))
    streaming.start()
    wait_for(lambda: debug(server.url, server.token)["engine"]["kv_pool"]["free"] < 8, "the long request runs")
    if how == "admin switch":
        assert kill_engine(server.url, server.token) == {"killed": first}
    else:
        os.kill(first, signal.SIGKILL)
    streaming.join(DEADLINE_S)
    assert not streaming.is_alive(), "a request in flight hung when its engine died"
    assert in_flight[0].status == 200 and "engine process died" in in_flight[0].error, in_flight[0]
    wait_for(lambda: get_json(server.url, "/health")[0] == 200, "the API reports a restarted engine healthy")
    state = debug(server.url, server.token)
    assert state["engine_pid"] != first and alive(state["engine_pid"]) and not alive(first)
    assert parent_of(state["engine_pid"]) == server.pid
    assert state["engine_restarts"] == 1
    assert state["engine"]["faults"]["gc"] is True, "the engine fault switched on was not switched on again"
    again = complete(server.url, "the same again", 8, temperature=0.0)
    assert again.ok and again.token_ids == reference.token_ids
    assert sample(metrics_text(server.url), "workload_engine_restarts_total") == 1


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_no_engine_outlives_the_api(server_factory, how: signal.Signals) -> None:
    server = server_factory("--engine-process")
    set_fault(server.url, "cpuhog", True, server.token)
    child = engine_pid(server)
    hogs = debug(server.url, server.token)["engine"]["cpuhog_pids"]
    assert alive(child) and hogs and all(alive(h) for h in hogs)
    folders = {Path(p).parent for p in bound_unix_paths(server.pid) if "workload-engine-" in p}
    server.proc.send_signal(how)
    server.proc.wait(DEADLINE_S)
    wait_for(lambda: not alive(child), f"the engine ended after the API's {how.name}", 30)
    wait_for(lambda: not any(alive(h) for h in hogs), f"the engine's hogs ended after the API's {how.name}", 30)
    if how == signal.SIGTERM:
        assert not any(f.exists() for f in folders), "the socket folder outlived a clean stop"
    for folder in folders:  # a SIGKILLed server cannot remove its own (docs/workload.md)
        shutil.rmtree(folder, ignore_errors=True)


def test_engine_metric_updates_replay_exactly_and_unknown_ones_are_refused() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from workload.metric_ops import OpRecorder, apply
    from workload.metrics import create_metrics

    recorder = OpRecorder()
    remote = recorder.metrics("m")
    remote.ttft.labels("m").observe(0.25)
    remote.success.labels("m", "length").inc()
    remote.running.labels("m").set(3)
    remote.observe_step(2, 9)
    direct_registry, replayed_registry = CollectorRegistry(), CollectorRegistry()
    direct, replayed = create_metrics(direct_registry, "m"), create_metrics(replayed_registry, "m")
    direct.ttft.labels("m").observe(0.25)
    direct.success.labels("m", "length").inc()
    direct.running.labels("m").set(3)
    direct.observe_step(2, 9)
    apply(replayed, recorder.drain())
    assert recorder.drain() == []

    def text(registry: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert text(replayed_registry) == text(direct_registry)
    with pytest.raises(ValueError, match="unknown metric update 'registry'"):
        apply(replayed, [("registry", [], "clear", 0.0)])
    with pytest.raises(ValueError, match="'ttft'.'labels'"):
        apply(replayed, [("ttft", ["m"], "labels", 0.0)])
