"""`infersight run`: the daemon — config, store, probes, collection loop, and the status page server."""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server

from agent import logs
from agent.alerts.service import AlertService
from agent.burst import BurstPolicy
from agent.changes import ChangeCollector, ChangeTracker
from agent.collectors import exits_probe
from agent.config import Config, check_config_paths
from agent.detection import Detection, DownState
from agent.detection_metrics import DetectionCollector
from agent.identity import IdentityReader
from agent.loop import CollectionLoop
from agent.memory import page_out_startup_files, pin_malloc_thresholds, trim_heap
from agent.metrics import build_registry
from agent.otlp.service import make_otlp_exporter, otlp_settings
from agent.peers import peer_uid
from agent.pidlock import PidLock
from agent.state import AgentState
from agent.stop_signals import set_on_signal
from agent.store import Store, open_store_dir
from agent.store.rollup import Rollup
from agent.target_policy import make_discover
from agent.target_sources import build_collectors
from analysis.window import Window
from dashboards.app import create_app

log = logging.getLogger("infersight.daemon")

# More than dashboards.limits lets slow endpoints hold (PROFILE_SLOTS + LIST_SLOTS + SUMMARY_SLOTS), so /metrics
# and the page always find a thread.
WEB_THREADS = 8
# Connections are cheap to hold and free to open: waitress's defaults (100 connections, idle ones closed after
# 120 s) let any local user's 100 idle sockets keep /metrics and the page from being accepted for minutes.
# Idle ones now go after 10-12 s, and it takes 1,000 to fill the server (poll(), not select(), above 1,024 fds).
WEB_CONNECTION_LIMIT = 1000
WEB_CHANNEL_TIMEOUT = 10
WEB_CLEANUP_INTERVAL = 2
# Open files the agent wants: every connection, plus probes, py-spy pipes and the store's connections.
WANT_NOFILE = 8192
# Connections one local user (or one remote address) may hold at once; the next is answered 503 and closed at
# once. A browser keeps about 6 per host and Prometheus 1; one user's 1,100 connections, each sent a byte every
# 3 s so that none is ever idle, used to fill the server and keep /metrics out for good. Root and the agent's
# own user are not counted (they own the agent anyway).
WEB_CONNECTIONS_PER_PEER = 64
# malloc_trim every 12 windows (a minute at 5 s): ~1 ms of CPU each; what a minute's windows free inside the heaps
# stays resident until then (~2 MiB measured; agent/memory.py).
TRIM_EVERY_WINDOWS = 12


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ListenError(OSError):
    """The status page cannot listen where configured; one line naming the address and what to do."""


class PeerLimit:
    """waitress's `channel_class` for a listener: a new connection becomes a channel unless its peer (the local
    user owning the other end, else the remote address) already holds `per_peer` of them; then it is answered
    503 and closed on the spot, so it never takes one of the server's connections."""

    def __init__(self, per_peer: int, exempt_uids: frozenset[int],
                 lookup: Callable[[tuple[str, int], tuple[str, int]], int | None] = peer_uid) -> None:
        if per_peer < 1:
            raise ValueError(f"per_peer must be >= 1, got {per_peer!r}")
        self.per_peer = per_peer
        self._exempt = exempt_uids
        self.lookup = lookup
        self.refused = 0
        self._said: dict[str, float] = {}
        self._cannot_ask = False

    def peer(self, conn: socket.socket, addr: tuple) -> str | None:
        """Whom a connection counts against: 'uid N', 'address A', or None (not counted)."""
        if not isinstance(addr, tuple) or len(addr) < 2 or not isinstance(addr[1], int):
            return None  # a Unix socket: its own permissions decide who connects
        host, port = str(addr[0]), addr[1]
        try:
            local = conn.getsockname()
        except OSError:
            return None
        try:
            uid = self.lookup((str(local[0]), int(local[1])), (host, port))
        except OSError as exc:
            uid = None
            if not self._cannot_ask:
                self._cannot_ask = True
                log.warning("cannot ask the kernel who holds a connection (sock_diag: %s); connections from "
                            "this host are not limited per user", exc.strerror or exc)
        if uid is not None:
            return None if uid in self._exempt else f"uid {uid}"
        # No socket of this host holds the other end: a remote peer. A loopback peer is always local, so no
        # answer there means the kernel could not be asked: counting every local user as one would let one of
        # them crowd out Prometheus, so nothing is counted.
        return None if ipaddress.ip_address(host.split("%")[0]).is_loopback else f"address {host}"

    def __call__(self, server, conn: socket.socket, addr, adj, map=None):
        peer = self.peer(conn, addr)
        if peer is not None:
            held = sum(1 for ch in list(server.active_channels.values()) if getattr(ch, "infersight_peer", None) == peer)
            if held >= self.per_peer:
                self._refuse(conn, peer)
                return None
        channel = HTTPChannel(server, conn, addr, adj, map=map)
        channel.infersight_peer = peer
        return channel

    def _refuse(self, conn: socket.socket, peer: str) -> None:
        self.refused += 1
        body = f"{peer} already holds {self.per_peer} connections to this agent (the limit); close some\n".encode()
        try:
            conn.send(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body, socket.MSG_DONTWAIT)
        except OSError:
            pass  # a full or reset socket: closing it says enough
        conn.close()
        now = time.monotonic()
        if now - self._said.get(peer, -math.inf) >= 60:  # once a minute per peer, or a flood floods the log too
            self._said[peer] = now
            log.warning("refusing connections from %s: it holds %d, the limit (%d refused since start)",
                        peer, self.per_peer, self.refused)


class WebServer:
    """waitress on its own thread, serving the status page and /metrics."""

    def __init__(self, app, host: str, port: int, *, connection_limit: int = WEB_CONNECTION_LIMIT,
                 channel_timeout: int = WEB_CHANNEL_TIMEOUT, cleanup_interval: int = WEB_CLEANUP_INTERVAL,
                 connections_per_peer: int = WEB_CONNECTIONS_PER_PEER) -> None:
        try:
            # channel_request_lookahead > 0 lets a handler ask whether its client is still there.
            self._server = create_server(app, host=host, port=port, threads=WEB_THREADS, ident="infersight",
                                         channel_request_lookahead=1, connection_limit=connection_limit,
                                         channel_timeout=channel_timeout, cleanup_interval=cleanup_interval,
                                         asyncore_use_poll=True)
        except OSError as exc:
            hint = ("another process (another infersight?) listens there; stop it or change `listen`"
                    if exc.errno == errno.EADDRINUSE else "change `listen` in the config")
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {hint}") from None
        self.peer_limit = PeerLimit(connections_per_peer, frozenset({0, os.geteuid()}))
        listeners = [self._server] if isinstance(self._server, BaseWSGIServer) else [
            d for d in self._server.map.values() if isinstance(d, BaseWSGIServer)]
        for listener in listeners:
            listener.channel_class = self.peer_limit
        self._thread = threading.Thread(target=self._server.run, name="web", daemon=True)
        if not _is_loopback(host):
            log.warning("listening on %s:%d: the status page, /metrics and the JSON API have no authentication "
                        "and are reachable from the network; listen on 127.0.0.1 unless a firewall limits "
                        "who can connect", host, port)

    @property
    def url(self) -> str:
        return f"http://{self._server.effective_host}:{self._server.effective_port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class Agent:
    """Everything `infersight run` starts, in one object, so tests and the demo can drive it too."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = AgentState()
        check_config_paths(config)
        otlp = otlp_settings(config)
        # Made and vetted on what is opened (agent.store.open_store_dir), before the lock file is created in it.
        store_dir, dir_fd = open_store_dir(Path(config.store_dir))
        os.close(dir_fd)
        # Before the store opens: two agents would write overlapping windows into one history.
        self.lock = PidLock(store_dir)
        self.lock.acquire()
        try:
            self.store = Store.open(Path(config.store_dir))
        except BaseException:
            self.lock.release()
            raise
        self.alerts = AlertService(config, self.store, on_error=self.state.count_error)
        self.registry = build_registry(self.state)
        self.registry.register(self.alerts.collector())
        self.otlp = make_otlp_exporter(config, otlp, self.registry, self.store, started=self.state.started,
                                       on_error=self.state.count_error)
        listeners: list = [self.alerts, DownState(self.state.set_down)]
        if self.otlp is not None:
            self.state.count_error("otlp", 0)  # the series exists before the first failure
            self.registry.register(self.otlp.collector())
            listeners.append(self.otlp.events)  # after the alert service, which files each episode first
        self.changes: ChangeTracker | None = None
        if config.identity.enabled:
            self.changes = ChangeTracker(self.store, IdentityReader(config.identity.env_allowlist,
                                                                    config.identity.refresh_windows),
                                         settle_windows=config.identity.settle_windows)
            self.registry.register(ChangeCollector(self.changes.latest))
        self.detection: Detection | None = None
        self.burst: BurstPolicy | None = None
        self._startup_paged_out = False
        self._fit_paged_out = False
        self._windows = 0
        if config.detector.enabled:
            warmup = config.detector.warmup_windows
            # With changes tracked, a new build keeps the old baseline: it is judged against it, and a regression
            # it brings is labelled `change` (docs/changes.md); without, a new command line means a new baseline.
            self.detection = Detection(self.store, make_detector=lambda: _latency_detector(warmup),
                                       identity=self._identity if self.changes is None else None,
                                       listeners=listeners,
                                       last_change=self.changes.last_change if self.changes is not None
                                       else lambda target: None)
            for target, finding in self.detection.snapshot().findings.items():
                if finding.state == "down" and finding.regression is not None:  # an outage the store held open
                    self.state.set_down(target, finding.regression.causes[0].evidence)
            self.registry.register(DetectionCollector(self.detection.snapshot))
            self.burst = BurstPolicy(self.detection.snapshot, max_seconds=config.stacks.burst_max_seconds,
                                     rise_min_windows=config.stacks.burst_rise_windows)
        self.rollup = Rollup(self.store)
        # The page reads through connections that cannot write; the agent alone writes the store.
        self.page_store = self.store.read_only()
        self.app = create_app({"STATE": self.state, "STORE": self.page_store, "REGISTRY": self.registry,
                               "STACKS_RATE_HZ": config.stacks.rate_hz, "INTERVAL_SECONDS": config.interval_seconds,
                               "FINDINGS": self.detection.snapshot if self.detection else None,
                               "ALERTS": self.alerts.view,
                               "CHECK_HOST": _is_loopback(config.listen_address[0])})
        host, port = config.listen_address
        try:
            self.web = WebServer(self.app, host, port)
        except BaseException:
            self.page_store.close()
            self.store.close()
            self.lock.release()
            raise
        self.loop = CollectionLoop(
            specs=config.targets,
            collectors=build_collectors(config, self.burst.wants_burst if self.burst is not None else None),
            state=self.state,
            discover_fn=make_discover(config, self.state),
            sink=self._sink,
            interval=config.interval_seconds,
            on_forget=self._forget,
            exits=exits_probe(config.probes.exits),
            on_down=self._down,
        )
        self.stop_event = threading.Event()

    def _identity(self, target: str) -> str | None:
        """What the target serves: its command line (a new model or binary gets a new baseline)."""
        for t in self.loop.watched:
            if t.name == target:
                return " ".join(t.cmdline)
        return None

    def _sink(self, window: Window) -> None:
        self.store.add_window(window)
        self._observe_identity(window)
        self._windows += 1
        if not self._startup_paged_out:
            # The first window is stored: the probes are compiled and every source runs, so what only starting
            # touched (the compiler's freed heap, the modules' initialisation) can go back to the kernel
            # (agent/memory.py) before the detector's first fit loads scikit-learn on top of it.
            self._startup_paged_out = True
            trim_heap()
            page_out_startup_files()
        elif self._windows % TRIM_EVERY_WINDOWS == 0:
            trim_heap()  # ~1 ms: the free pages that windows' work left inside the heaps
        if self.detection is None:
            return
        try:
            verdict = self.detection.observe(window)
        except Exception:  # a detector fault must not cost the window, already stored; counted and shown
            self.state.count_error("detector")
            log.exception("detector failed on the window of %s", window.target)
            return
        if verdict is not None and verdict.state != "warmup" and not self._fit_paged_out:
            # The first fit has run: scikit-learn and the scipy it imports are loaded, and most of what their
            # import touched is never run again.
            self._fit_paged_out = True
            trim_heap()
            page_out_startup_files()

    def _observe_identity(self, window: Window) -> None:
        if self.changes is None:
            return
        watched = self.loop.watched
        target = next((t for t in watched if t.name == window.target and t.pid == window.pid), None)
        if target is None:
            return
        try:
            self.changes.observe(target, window)
            self.changes.forget(watched)
        except Exception:  # an identity the store cannot take must not cost the window, already stored
            self.state.count_error("identity")
            log.exception("identity of %s not recorded", window.target)

    def _down(self, target: str, pid: int, at: float, reason: str) -> None:
        if self.detection is None:
            return
        try:
            self.detection.target_down(target, pid, at, reason)
        except Exception:  # a store failure here must not stop collection; counted and shown
            self.state.count_error("detector")
            log.exception("detector could not record that %s is down", target)

    def _forget(self, target: str) -> None:
        if self.burst is not None:
            self.burst.forget(target)
        if self.detection is None:
            return
        try:
            self.detection.forget(target)
        except Exception:  # a store failure here must not stop collection; counted and shown
            self.state.count_error("detector")
            log.exception("detector could not forget %s", target)

    def run(self) -> None:
        self.web.start()
        self.alerts.start()
        if self.otlp is not None:
            self.otlp.start()
        log.info("status page at %s/ and metrics at %s/metrics", self.web.url, self.web.url)
        self.loop.start()
        housekeeping = threading.Thread(target=self._housekeeping, name="housekeeping", daemon=True)
        housekeeping.start()
        try:
            self.loop.run(self.stop_event)
        finally:
            self.close()

    def _housekeeping(self) -> None:
        # Retention once at start, then hourly: deleting old windows is cheap but VACUUM is not. The page's minute
        # rollup every 5 minutes, so a 7-day chart never waits for more than a few minutes of windows to be read.
        rounds = 0
        while True:
            if rounds % 12 == 0:
                try:
                    self.store.apply_retention(max_age_s=self.config.retention_seconds,
                                               max_bytes=self.config.retention_bytes)
                except Exception:  # a retention failure must not kill the agent; counted and logged
                    self.state.count_error("retention")
                    log.exception("retention failed")
            try:
                self.rollup.warm([t.name for t in self.store.targets()])
            except Exception:  # the page reads windows directly without it; counted and logged
                self.state.count_error("rollup")
                log.exception("minute rollup failed")
            rounds += 1
            if self.stop_event.wait(300):
                return

    def close(self) -> None:
        self.stop_event.set()
        self.loop.close()
        if self.detection is not None:
            self.detection.flush()
        self.web.stop()
        self.alerts.stop()
        if self.otlp is not None:
            self.otlp.stop()
        self.page_store.close()
        self.store.close()
        self.lock.release()
        log.info("stopped")


def _latency_detector(warmup_windows: int):
    from analysis.detector import LatencyDetector  # scikit-learn: imported only by an agent that detects
    from analysis.latency_model import set_import_step

    set_import_step(page_out_startup_files)  # scikit-learn's import, at the first fit, in steps (agent/memory.py)
    return LatencyDetector(warmup_windows=warmup_windows)


def raise_nofile(want: int = WANT_NOFILE) -> int:
    """Raise the soft open-file limit towards `want` (never above the hard limit); returns the new soft limit.
    systemd's default soft limit of 1,024 is less than the web server's connection limit alone."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < new:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return new
    return soft


def run(config: Config) -> int:
    pin_malloc_thresholds()  # before the BPF compile's large blocks come and go (agent/memory.py)
    logs.setup(config.log_level)
    nofile = raise_nofile()
    if nofile != resource.RLIM_INFINITY and nofile < WEB_CONNECTION_LIMIT + 256:
        log.warning("open-file limit %d is below the web server's %d connections: raise LimitNOFILE",
                    nofile, WEB_CONNECTION_LIMIT)
    agent = Agent(config)

    on_signal = set_on_signal(agent.stop_event, before=lambda signum: log.info("signal %d: stopping", signum))
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run()
    return 0
