"""The JSON blueprints' error answers, and the store guard every store-reading view shares."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, current_app, jsonify
from werkzeug.exceptions import HTTPException


def json_errors(bp: Blueprint, *codes: int) -> None:
    """`codes` raised in bp's views answer `{"error": description}` with that status; any other code keeps Flask's
    own answer (a blueprint lists the codes its views raise, so an unexpected one is not dressed as expected)."""
    for code in codes:
        bp.register_error_handler(code, _json_error)


def _json_error(err: HTTPException):
    return jsonify(error=err.description), err.code


def require_store() -> Any:
    """The agent's store, or a 503 when the app was built without one (the page can run on live state alone)."""
    store = current_app.config["STORE"]
    if store is None:
        abort(503, description="no store is configured")
    return store
