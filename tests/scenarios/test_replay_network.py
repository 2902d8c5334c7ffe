"""CI replay of the clients'-latency set (tests/scenarios/network, docs/delivery.md) as far as it is recorded, one live
run each (docs/BENCHMARKS.md, "Network scenarios, recorded live"). What each shows is pinned here, the shortfall
included, with the reason: a change in either direction shows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.evaluation import command
from agent.evaluation.clients import compare
from agent.evaluation.detection import detect
from agent.evaluation.recording import read_recording
from analysis.detector import LatencyDetector
from analysis.scoring import score_run

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "recorded-network"

# Recording -> windows from onset to the regression opening, as recorded (None: not found). The issue asks for 2.
DELAYS: dict[str, int | None] = {
    # 15 % loss on the replies, a connection per request: nearly all of it hits the handshakes' SYN-ACKs (the
    # connection setup wait, docs/delivery.md "Connection setup", 0 before onset, >0 in 17 of 18 fault windows), and
    # each slow client waits 1 s. Re-recorded 2026-12-04 16:40-16:48 UTC under the exclusive lock (load average
    # 1.4-1.5, nothing else compiling or recording): 88 SYN-ACKs resent in the fault, 49 connections that waited.
    # Its first fault window scored 12 with 2 of 21 connections waiting (connect_wait x10, under the x16 that opens
    # one window alone); the second (6 of 26, x23) opened by the 2-of-3 rule: after 1 window. (The recording of
    # 13:14, beside a BPF compile: at onset, and a `blocked` false alarm; of 06:18, on a host at load 5.6: after 2
    # windows; before the network's part was judged given the server's latency: 4; before the connection setup
    # wait was measured: 8.)
    "reply_loss": 1,
    # 15 % loss on what the clients send, re-recorded 2026-12-04 17:46-17:54 UTC under the exclusive lock (load
    # average 0.6-0.8) with the first request's wait (docs/delivery.md "The first request"): 14 of 362 fresh
    # connections' first requests came 0.2-0.63 s after their handshake, in 11 of the 18 fault windows, none of the
    # 1,393 before and after; the first of them only in the 3rd fault window (one, 0.21 s). Found after 3 windows,
    # named network, as before the wait was measured: the server's resends for lost ACKs (67 in 17 of 18 fault
    # windows, 1 in the 66 others) carry it. A lost SYN never reaches the server (no SYN-ACK resent in the phase).
    # The clients' p99 was 1.1-3.3 s in 16 of 18 fault windows: loss the server cannot see (docs/detector.md "Loss on
    # the way to the server, measured"). (The recording of 13:37: after 3 windows; of 06:26: not found.)
    "request_loss": 3,
    # The server's port policed to 4 kB/s (recorded 2026-12-04 10:24-10:31 UTC): every reply (and the agent's own
    # /metrics scrape, on the same port) crawls, so no window of the phase had server latency to score. Only windows
    # in which some reply was finally acknowledged carried delivery (3-53 s: `network` x600+, a strong cause with the
    # stall rule); the 2nd and 3rd fault windows acknowledged none and had no other signal moved, so the 2-of-3 rule
    # opened on the 4th. The first window stalled with a reply acknowledged 3.1 s late (x310, measured by the
    # kernel): it opens by itself (docs/detector.md "One window"), at onset.
    "bandwidth": 0,
    # 3 s of 50 % loss on the replies, re-recorded 2026-12-04 17:39-17:46 UTC under the exclusive lock (load
    # average 3.7 at the start, left by the run before, 0.7 at the end). Its one window (labelled by the window
    # holding most of it) scored 21 with 3 of 21 connections waiting a resent SYN-ACK (connect_wait x14, the
    # clients' p99 1.20 s against 0.12-0.42 s in normal windows): one anomalous window. Under the x16 ratio bar it
    # was missed (the 2-of-3 rule needs two); counted against the baseline's 0 of 860 handshakes, three of 21 has a
    # chance of 4.3e-6 in a healthy window, under stall_event_alpha (1e-5): found at onset (docs/detector.md "Stall
    # events, counted"). (The recording of 11:18 had 7 of 20 connections waiting, x37: found at onset, beside a
    # cpu_contention false alarm from other developers' load.)
    "burst": 0,
    # 3 s of 35 % loss on the replies, recorded live 2026-12-05 02:56-03:03 UTC under the exclusive lock (load average
    # 3.4 at the start, left by the run before, 1.0 at the end), with the counted SYN-ACK waits in the detector: its
    # one window (w48) is anomalous (network part 13.7 spreads) with 2 of 21 connections waiting a resent SYN-ACK
    # (4 SYN-ACKs resent; the clients' p99 2.31 s against 0.17-0.36 s around it). Against the baseline's 0 of 911
    # handshakes (42 windows) two have a chance of 1.9e-4 in a healthy window, over stall_event_alpha (1e-5): missed.
    # Two would pass after a baseline of ~200 such windows (chance ~0.375 / windows^2; docs/detector.md "Stall events,
    # counted").
    "burst_shallow": None,
    # 2 s of 50 % loss on the replies, recorded live 2026-12-05 03:12-03:18 UTC under the exclusive lock (load average
    # 1.25 -> 0.45), with the counted SYN-ACK waits: its one window (w48) had 6 of 23 connections waiting a resent
    # SYN-ACK (11 SYN-ACKs resent; chance 5e-11 against the baseline's 0 of 911) and a reply's delivery p99 x73:
    # found at onset live and in replay, named network, no false alarm. The x16 ratio bar finds it too
    # (connect_wait x29, delivery_p99 x73).
    "burst_short": 0,
    # 10 % loss both ways (recorded 2026-12-04 11:34-11:41 UTC): found after 1 window with the detector of before the
    # network's part and the 2-of-3 rule; its first window scored 69 (RTO stalls, p99 delivery, retransmitted replies
    # x44-47 each): at onset.
    "both_loss": 0,
}

# Recording -> the top causes of the episodes that opened outside every fault phase and its tail, as recorded.
FALSE_ALARMS: dict[str, list[str]] = {
    # None since reply_loss and burst were re-recorded under the exclusive lock (2026-12-04 16:40 and 17:39 UTC):
    # their earlier recordings' `blocked` (a BPF compile beside the run) and `cpu_contention` (other developers'
    # load) alarms were the host's, not the scenarios'.
}

# Recording -> (windows with both the agent's clients' p99 estimate and the load generator's measured p99, those
# within 20 %), as recorded (agent.evaluation.clients). The shortfall in normal windows is the server's own
# histogram's resolution, not delivery: at ~20 requests the clients' nearest-rank p99 is the slowest request, in a
# bucket 1.33-1.67 times wide. Read at the bucket's least-relative-error point when alone or with one other
# (analysis/client_latency.py SPARSE), at j/(k+1) of the bucket when it shares it with more (session 21; it was j/k,
# the slowest at the upper bound), and the delivery's first bucket (0-10 ms) read to keep the measured sum (~0.1 ms
# a reply on loopback): the estimate is within 20 % in 60, 60, 66, 68 and 65 normal windows of reply_loss,
# request_loss, bandwidth, burst and both_loss (53, 54, 63, 60, 55 with j/k; 37, -, 45, 35, 29 before the sparse and
# first-bucket reads) (docs/BENCHMARKS.md "Network scenarios, recorded live").
CLIENTS: dict[str, tuple[int, int]] = {
    # Normal windows 60 of 66; fault windows 0 of 18: the clients waited 1-3 s for lost SYNs and requests, which the
    # server's kernel never sees, or sees as one 0.2 s wait in ~20 requests (docs/detector.md "Loss on the way to the
    # server").
    "request_loss": (84, 60),
    # Fault windows 16 of 18 within 20 %; normal windows 60 of 66 (the clients' p99 0.17-0.62 s in this run, the
    # server's own histogram's resolution as above).
    "reply_loss": (84, 76),
    # No request of the policed phase finished while the agent had an estimate; every normal window is within 20 %
    # (the six after the phase, where the queued replies landed, clients' p99 54.5-54.8 s, within 10 %).
    "bandwidth": (66, 66),
    # The burst's own window: 1.240 s estimated, 1.202 s measured; normal windows 68 of 72 (the 4 others
    # 1.22-1.38: the server's histogram's resolution, as above).
    "burst": (73, 69),
    # Normal windows 64 of 72; the burst's window 0.55 (1.27 s estimated, 2.31 s measured: a client waited ~2.3 s
    # where the estimate adds the slow connections' mean wait, 1 s).
    "burst_shallow": (73, 64),
    # Normal windows 68 of 71; the burst's window 1.21 (1.75 s estimated, 1.45 s measured).
    "burst_short": (72, 68),
    # Fault windows 7 of 16 within 20 % (estimate/measured 0.15-1.55): lost requests and SYNs are the clients' own
    # retransmits, which the server's kernel does not see.
    "both_loss": (82, 73),
}


def _path(name: str) -> Path:
    return RECORDED / f"{name}.jsonl.gz"


def test_every_recording_is_pinned() -> None:
    assert sorted(p.name.removesuffix(".jsonl.gz") for p in RECORDED.glob("*.jsonl.gz")) == sorted(DELAYS)


@pytest.mark.parametrize("name", sorted(DELAYS))
def test_every_window_carries_the_delivery_reading(name: str) -> None:
    items = read_recording(_path(name)).windows[2:]
    assert all(item.window.delivery is not None for item in items)
    # Before the fault every window had replies acknowledged; under a policer some fault windows had none.
    assert all(item.window.delivery.replies > 0 for item in items if item.phase == 0)


@pytest.mark.parametrize("name", sorted(DELAYS))
def test_network_fault_is_found_and_named_network_and_false_alarms_are_pinned(name: str) -> None:
    [run] = command.replay([_path(name)], LatencyDetector)
    [phase] = run.score.fault_phases
    stray = [run.outcomes[e.window].top_cause for e in run.score.episodes if e.phase is None]
    assert stray == FALSE_ALARMS.get(name, [])
    if DELAYS[name] is None:
        assert not phase.detected
        return
    assert phase.detected and phase.top_cause == "network"
    assert phase.delay_windows == DELAYS[name]


def test_reply_loss_shows_in_connection_setup_only_while_the_fault_lasts() -> None:
    """The signal the SYN-ACK tracepoint adds: no connection waited for a resent SYN-ACK before the fault, nearly every
    fault window had some."""
    windows = read_recording(_path("reply_loss")).windows
    before = [w.window.delivery for w in windows if w.phase == 0]
    during = [w.window.delivery for w in windows if w.phase == 1]
    assert sum(d.slow_connects for d in before) == 0 and sum(d.synack_retransmits for d in before) == 0
    assert sum(d.slow_connects > 0 for d in during) >= 0.8 * len(during)
    waits = [d.connect_wait_seconds / d.slow_connects for d in during if d.slow_connects]
    assert all(1.0 <= w < 1.5 for w in waits), waits  # one SYN-ACK timeout (1 s) each, plus the RTT


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_the_clients_estimate_against_what_the_load_generator_measured(name: str) -> None:
    windows = read_recording(_path(name)).windows
    assert all(w.clients is not None for w in windows)
    got = compare(windows)
    assert got is not None and (got["windows"], sum(r["within"] for r in got["per_window"])) == CLIENTS[name]


def test_every_recording_carries_the_load_generators_figures() -> None:
    older = [n for n in DELAYS if compare(read_recording(_path(n)).windows) is None]
    assert older == [] and sorted(CLIENTS) == sorted(DELAYS)


def test_request_loss_shows_late_first_requests_only_while_the_fault_lasts() -> None:
    """The first request's wait: no fresh connection's first request came late before or after the fault, and those
    in it came one client RTO or two after the handshake (0.2-0.65 s), nearly all beside resends of the server's own."""
    windows = read_recording(_path("request_loss")).windows[2:]  # the first two: before the probe's first read
    outside = [w.window.delivery for w in windows if w.phase != 1]
    during = [w.window.delivery for w in windows if w.phase == 1]
    assert all(d.first_requests is not None for d in outside + during)
    assert sum(d.late_requests for d in outside) == 0 and sum(d.idle_connects for d in outside + during) == 0
    assert sum(d.late_requests for d in during) == 14 and sum(d.late_requests > 0 for d in during) == 11
    assert all(0.2 <= d.request_wait_seconds / d.late_requests <= 0.65 for d in during if d.late_requests)
    # Beside a resend of the server's own (the detector counts the wait only there): 10 of those 11 windows.
    assert sum(d.retransmits > 0 for d in during if d.late_requests) == 10


def _after_a_longer_baseline(name: str, copies: int) -> list:
    """The recording with `copies` replays of its own healthy windows before it, each shifted back in time by the
    recording's span: the baseline an agent holds after running that much longer on the same healthy traffic."""
    windows = read_recording(_path(name)).windows
    healthy = [w for w in windows[2:] if w.phase == 0]
    span = windows[-1].window.end - windows[0].window.start
    earlier = [dataclasses.replace(w, window=dataclasses.replace(w.window, start=w.window.start - k * span,
                                                                  end=w.window.end - k * span))
               for k in range(copies, 0, -1) for w in healthy]
    return earlier + windows


@pytest.mark.parametrize(("copies", "found"), [(2, False), (4, True)])
def test_the_shallow_burst_is_found_once_the_baseline_is_long_enough(copies: int, found: bool) -> None:
    """The floor of the missed shallow burst is the baseline's length, not the signal: two of 21 connections waiting
    a resent SYN-ACK are too likely for a healthy window against 42 windows with none (1.9e-4), not against ~230
    (19 minutes of the same healthy traffic; the baseline keeps up to 720 windows). With 134 windows it still
    misses; with 226 it is found at onset, named network, and the longer healthy run raises no false alarm."""
    outcomes = detect(LatencyDetector, _after_a_longer_baseline("burst_shallow", copies))
    score = score_run("burst_shallow", outcomes)
    [phase] = score.fault_phases
    assert [e.phase for e in score.episodes] == ([1] if found else [])
    assert phase.detected is found
    if found:
        assert phase.top_cause == "network" and phase.delay_windows == 0
