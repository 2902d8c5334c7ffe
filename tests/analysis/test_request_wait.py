"""The first request's wait after the handshake (probes/delivery.py): a lost request resent, against clients that
connect ahead of use (docs/detector.md "The first request's wait")."""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import pytest

from analysis.detector import LatencyDetector
from analysis.features import extract
from analysis.network_part import DIRECT, PARTS
from tests.analysis import synth
from tests.analysis.synth import Load

QUIET = Load(delivery=True, first_requests=True)
# A pool that opens 30 % of its connections 0.2-3 s ahead of use, every window: its habit, in the baseline.
POOL = replace(QUIET, early_connects=0.3)
NOISY = Load(delivery=True, first_requests=True, host_noise=0.5, base_latency=0.3)


def feed(det: LatencyDetector, windows) -> list:
    return [det.update(w) for w in windows]


def opened(verdicts) -> list[int]:
    return [i for i, v in enumerate(verdicts) if v.opened is not None]


def _windows(start: int, count: int, load: Load, seed: int, resend_every: int = 0) -> list:
    ws = synth.windows(start, count, load, seed=seed)
    return [_resending(w) if resend_every and i % resend_every == 0 else w for i, w in enumerate(ws)]


@functools.cache
def _armed(load: Load, seed: int, resend_every: int = 0) -> str:
    det = LatencyDetector()
    feed(det, _windows(0, 60, load, seed, resend_every))
    return json.dumps(det.get_state())


def armed(load: Load, seed: int = 0, resend_every: int = 0) -> LatencyDetector:
    det = LatencyDetector()
    det.set_state(json.loads(_armed(load, seed, resend_every)))
    return det


def test_the_wait_is_a_part_of_the_network_but_never_decisive_alone():
    assert "request_wait" in PARTS
    assert "request_wait" not in {s.name for s in DIRECT}


def test_unmeasured_is_none_not_zero():
    w = synth.window(60, Load(delivery=True))  # a delivery reading without first requests (older recordings)
    assert w.delivery.first_requests is None
    assert extract(w).request_wait_per_request is None
    assert extract(synth.window(60, QUIET)).request_wait_per_request == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_lost_first_requests_open_network_within_two_windows(seed):
    """15 % of the connections' first requests lost and resent 0.2-0.65 s later: the server's latency and the
    replies' delivery do not move; the wait after the handshake does. Open by the second window after onset, named
    network, the wait in the evidence."""
    det = armed(QUIET, seed)
    vs = feed(det, synth.windows(60, 4, replace(QUIET, request_loss=0.15), seed=seed))
    first = opened(vs)
    assert first and first[0] <= 2, [v.score for v in vs]
    cause = vs[first[0]].opened.causes[0]
    assert cause.label == "network", cause
    assert "first requests arrived" in cause.evidence, cause.evidence


def _resending(w, n: int = 2):
    """The window with the server's sockets resending n segments (a path that also loses some clients' ACKs)."""
    w.delivery.retransmits += n
    return w


def test_late_first_requests_count_only_beside_a_resend_of_the_servers_own():
    w = synth.window(60, replace(QUIET, early_connects=1.0))
    assert w.delivery.late_requests > 0 and w.delivery.retransmits == 0
    assert extract(w).request_wait_per_request == 0.0  # a pool ahead of use on a clean path costs no resend
    got = extract(_resending(w)).request_wait_per_request
    assert got == pytest.approx(w.delivery.request_wait_seconds / w.latency.requests)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("resend_every", [1, 2])
def test_a_pool_that_connects_ahead_of_use_as_its_habit_opens_nothing(seed, resend_every):
    """Waits of 0.2-3 s on 30 % of the connections, in the baseline and after, on a path where the server resends
    in every window, or every other: the resend guard lets those windows' waits through, and the baseline (its
    high quantile, as the wait is heavy-tailed) holds them."""
    det = armed(POOL, seed, resend_every)
    assert opened(feed(det, _windows(60, 120, POOL, seed, resend_every))) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_pool_warming_up_in_one_window_opens_nothing(seed):
    """Every connection of one window opened 0.2-3 s ahead of use (a client restarting its pool) while the server
    happened to resend, then none: an anomalous window, but the wait is not a decisive signal, and the 2-of-3 rule
    needs a second."""
    det = armed(QUIET, seed)
    warm = [_resending(synth.window(60, replace(QUIET, early_connects=1.0), seed=seed))]
    vs = feed(det, warm + synth.windows(61, 6, QUIET, seed=seed))
    assert vs[0].score is not None and vs[0].score > 4, vs[0].score  # the window is anomalous: the guard is the rule
    assert opened(vs) == [], [v.score for v in vs]


@pytest.mark.parametrize("seed", range(4))
def test_on_a_noisy_host_healthy_first_requests_open_nothing(seed):
    det = armed(NOISY, seed)
    assert opened(feed(det, synth.windows(60, 120, NOISY, seed=seed))) == []
