"""`infersight run`: the daemon — config, store, probes, collection loop, and the status page server."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType

from waitress.server import create_server

from agent import logs
from agent.burst import BurstPolicy
from agent.config import Config, check_config_paths
from agent.detection import Detection
from agent.detection_metrics import DetectionCollector
from agent.loop import CollectionLoop
from agent.metrics import build_registry
from agent.probeset import ProbeSet
from agent.state import AgentState
from agent.store import Store
from agent.target_sources import make_target_sources
from analysis.window import Window
from dashboards.app import create_app

log = logging.getLogger("infersight.daemon")


class WebServer:
    """waitress on its own thread, serving the status page and /metrics."""

    def __init__(self, app, host: str, port: int) -> None:
        self._server = create_server(app, host=host, port=port, threads=4, ident="infersight")
        self._thread = threading.Thread(target=self._server.run, name="web", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self._server.effective_host}:{self._server.effective_port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.close()
        self._thread.join(timeout=5)


class Agent:
    """Everything `infersight run` starts, in one object, so tests and the demo can drive it too."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = AgentState()
        check_config_paths(config)
        os.makedirs(config.store_dir, mode=0o700, exist_ok=True)
        self.store = Store.open(Path(config.store_dir))
        self.registry = build_registry(self.state)
        self.detection: Detection | None = None
        self.burst: BurstPolicy | None = None
        if config.detector.enabled:
            warmup = config.detector.warmup_windows
            self.detection = Detection(self.store, make_detector=lambda: _latency_detector(warmup),
                                       identity=self._identity)
            self.registry.register(DetectionCollector(self.detection.snapshot))
            self.burst = BurstPolicy(self.detection.snapshot)
        self.app = create_app({"STATE": self.state, "STORE": self.store, "REGISTRY": self.registry,
                               "PYSPY_RATE_HZ": config.pyspy_rate_hz, "INTERVAL_SECONDS": config.interval_seconds,
                               "FINDINGS": self.detection.snapshot if self.detection else None})
        host, port = config.listen_address
        self.web = WebServer(self.app, host, port)
        self.loop = CollectionLoop(
            specs=config.targets,
            probes=ProbeSet(config.probes.enabled()),
            make_sources=lambda t: make_target_sources(
                t, config, pyspy=config.pyspy_enabled,
                wants_burst=self.burst.wants_burst if self.burst is not None else None),
            state=self.state,
            sink=self._sink,
            interval=config.interval_seconds,
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
        if self.detection is None:
            return
        try:
            self.detection.observe(window)
        except Exception:  # a detector fault must not cost the window, already stored; counted and shown
            self.state.count_error("detector")
            log.exception("detector failed on the window of %s", window.target)

    def run(self) -> None:
        self.web.start()
        log.info("status page at %s/ and metrics at %s/metrics", self.web.url, self.web.url)
        self.loop.start()
        retention = threading.Thread(target=self._retention, name="retention", daemon=True)
        retention.start()
        try:
            self.loop.run(self.stop_event)
        finally:
            self.close()

    def _retention(self) -> None:
        # Once at start, then hourly: deleting old windows is cheap but VACUUM is not.
        while True:
            try:
                self.store.apply_retention(max_age_s=self.config.retention_seconds,
                                           max_bytes=self.config.retention_bytes)
            except Exception:  # a retention failure must not kill the agent; counted and logged
                self.state.count_error("retention")
                log.exception("retention failed")
            if self.stop_event.wait(3600):
                return

    def close(self) -> None:
        self.stop_event.set()
        self.loop.close()
        self.web.stop()
        self.store.close()
        log.info("stopped")


def _latency_detector(warmup_windows: int):
    from analysis.detector import LatencyDetector  # scikit-learn: imported only by an agent that detects

    return LatencyDetector(warmup_windows=warmup_windows)


def run(config: Config) -> int:
    logs.setup(config.log_level)
    agent = Agent(config)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run()
    return 0
