"""The status page's Flask app factory: page and JSON blueprints, /metrics beside them."""

from __future__ import annotations

import time
from typing import Any

from flask import Flask
from prometheus_client import CollectorRegistry, make_wsgi_app
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from dashboards.hostcheck import HostCheck
from dashboards.limits import LIST_SLOTS, PROFILE_SLOTS, SUMMARY_SLOTS, Gate


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build the app. config keys: STATE (the agent's live state), STORE (its store, read-only: a
    dashboards.reader.StoreReader; the page never writes), REGISTRY (prometheus),
    STACKS_RATE_HZ and INTERVAL_SECONDS (to label and time profiles), FINDINGS (a callable giving the
    detector's latest findings, or None), ALERTS (a callable returning the alert outbox as plain dicts, or
    None when the agent delivers no alerts), READ_SECONDS (how long one request may read stored profiles; dashboards.limits)."""
    app = Flask(__name__)
    app.config.update(STATE=None, STORE=None, REGISTRY=None, STACKS_RATE_HZ=None, INTERVAL_SECONDS=5.0,
                      FINDINGS=None, ALERTS=None, PROFILE_GATE=Gate(PROFILE_SLOTS, "profile"),
                      LIST_GATE=Gate(LIST_SLOTS, "store read"),
                      SUMMARY_GATE=Gate(SUMMARY_SLOTS, "summary request"))
    if config:
        app.config.update(config)

    from dashboards import api, changes_api, findings, flame_api, page, pages, profiles_api, security, series_api

    # A missing figure reads as a dash, never as Python's "None".
    app.jinja_env.filters["dash"] = lambda v: "–" if v is None else v
    app.jinja_env.filters["timestamp"] = lambda ts: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))

    app.register_blueprint(page.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(profiles_api.bp)
    app.register_blueprint(findings.bp)
    app.register_blueprint(series_api.bp)
    app.register_blueprint(flame_api.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(changes_api.bp)
    security.init_app(app)

    registry: CollectorRegistry | None = app.config["REGISTRY"]
    if registry is not None:
        app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {"/metrics": make_wsgi_app(registry)})
    # Always on: a browser on another host reaches an agent that listens beyond loopback just the same.
    app.wsgi_app = security.SameOrigin(app.wsgi_app)
    # Off only when the agent listens beyond loopback: then the network reaches it anyway, and a
    # Prometheus server may scrape it by any of the host's DNS names.
    if app.config.get("CHECK_HOST", True):
        app.wsgi_app = HostCheck(app.wsgi_app)
    return app
