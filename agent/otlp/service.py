"""Build the agent's OTLP exporter from the config, or None when `[otlp]` is absent."""

from __future__ import annotations

import socket
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from agent.alerts.service import external_url
from agent.config import Config, ConfigError
from agent.otlp.config import OtlpFieldError, settings
from agent.otlp.exemplars import ExemplarWatch
from agent.otlp.exporter import OtlpExporter
from agent.store import Store
from agent.target_sources import scrape_deadline


def make_otlp_exporter(config: Config, registry: CollectorRegistry, store: Store, *, started: float,
                       on_error: Callable[[str], None] | None = None) -> OtlpExporter | None:
    """A wrong OTEL_EXPORTER_OTLP_* variable stops the agent at start with one line, like a wrong config key."""
    if config.otlp is None:
        return None
    host = config.alerts.host or socket.gethostname()
    try:
        resolved = settings(config.otlp, interval_seconds=config.interval_seconds, host=host)
    except OtlpFieldError as err:
        raise ConfigError(f"otlp: {err}") from None
    # Histogram latency sources only: exemplars sit on bucket lines.
    watched = [(t.name, t.latency.url, t.latency.metric,
                scrape_deadline(t.latency.timeout_seconds, resolved.export_interval_seconds))
               for t in config.targets if t.latency is not None and t.latency.kind == "histogram"]
    return OtlpExporter(resolved, registry, store, config.alerts, host=host, external_url=external_url(config),
                        started=started, on_error=on_error, exemplars=ExemplarWatch(watched) if watched else None)
