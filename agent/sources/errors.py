"""Domain errors for user-space sources, beside the probes' TargetGone and AccessDenied."""

from probes.errors import ProbeError


class ReadingError(ProbeError):
    """A source could not produce a reading this window (endpoint down, metric missing, bad text)."""


class SourceUnavailable(ProbeError):
    """A source cannot run on this host at all (its binary or library is missing)."""
