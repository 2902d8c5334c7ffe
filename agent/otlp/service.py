"""Build the agent's OTLP exporter from the config, or None when `[otlp]` is absent."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from agent.alerts.service import external_url
from agent.config import Config, ConfigError
from agent.otlp.config import OtlpFieldError, OtlpSettings, settings
from agent.store import Store
from agent.target_sources import scrape_deadline

if TYPE_CHECKING:
    from agent.otlp.exporter import OtlpExporter


def otlp_settings(config: Config) -> OtlpSettings | None:
    """The [otlp] table with the environment filled in. A wrong OTEL_EXPORTER_OTLP_* variable stops the agent at
    start with one line, like a wrong config key: call this before anything is opened."""
    if config.otlp is None:
        return None
    try:
        return settings(config.otlp, interval_seconds=config.interval_seconds, host=_host(config))
    except OtlpFieldError as err:
        raise ConfigError(f"otlp: {err}") from None


def make_otlp_exporter(config: Config, resolved: OtlpSettings | None, registry: CollectorRegistry, store: Store, *,
                       started: float, on_error: Callable[[str], None] | None = None) -> OtlpExporter | None:
    if resolved is None:
        return None
    # Imported here, not at the top: the OpenTelemetry SDK and protobuf cost the agent ~10 MiB of RSS, which an
    # agent without [otlp] (the default) should not pay.
    from agent.otlp.exemplars import ExemplarWatch
    from agent.otlp.exporter import OtlpExporter

    # Histogram latency sources only: exemplars sit on bucket lines.
    watched = [(t.name, t.latency.url, t.latency.metric,
                scrape_deadline(t.latency.timeout_seconds, resolved.export_interval_seconds))
               for t in config.targets if t.latency is not None and t.latency.kind == "histogram"]
    return OtlpExporter(resolved, registry, store, config.alerts, host=_host(config),
                        external_url=external_url(config), started=started, on_error=on_error,
                        exemplars=ExemplarWatch(watched) if watched else None)


def _host(config: Config) -> str:
    return config.alerts.host or socket.gethostname()
