"""SIGTERM or SIGINT asks a scenario command to stop at its next check, so it can undo what it set up (its file,
its cgroup, its child) before it exits; the runner ends every phase command this way (agent/evaluation/processes.py)."""

from __future__ import annotations

import signal


class StopRequest:
    """Installs the handlers; `requested` turns true at the first signal and stays so."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._request)
        signal.signal(signal.SIGINT, self._request)

    def _request(self, *_: object) -> None:
        self.requested = True
