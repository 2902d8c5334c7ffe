"""Domain errors of every collector: each says why a target cannot be measured, in words a user can act on."""


class ProbeError(Exception):
    """Base class: a probe or source could not start or read."""


class ProbeUnavailable(ProbeError):
    """The probe cannot run on this host (no BCC, no BPF, tracepoint missing, compile failure)."""


class NotRoot(ProbeUnavailable):
    """Loading BPF programs needs root (CAP_BPF + CAP_PERFMON)."""


class TracepointMissing(ProbeUnavailable):
    """A tracepoint the probe attaches to does not exist in this kernel's tracefs."""


class Unsupported(ProbeUnavailable):
    """The target cannot be traced by this probe (e.g. an interpreter without the needed symbol)."""


class TargetGone(ProbeError):
    """The target process exited."""


class AccessDenied(ProbeError):
    """The OS refused access to the target process."""


class ReadingError(ProbeError):
    """A source could not produce a reading this window (endpoint down, metric missing, nothing sampled)."""


class NoAnswer(ReadingError):
    """The target's endpoint did not answer at all (a timeout, a refused or reset connection). Unlike a wrong answer
    (an HTTP error, a missing metric) this is news about the target: a stopped or cut-off server answers nothing.

    `stage` says where: "connect" when no connection was made (refused, timed out, no route: nothing reached the
    port; the kernel completes the handshake even for a stopped process), "closed" when no connection was made
    and nothing listens on that loopback port at all (the server closed it, or has not opened it yet: no
    firewall makes that), "response" when the request went out on a connection and no reply came in time (a
    stopped, stuck or overloaded server)."""

    def __init__(self, message: str, stage: str = "response") -> None:
        super().__init__(message)
        self.stage = stage


class SourceUnavailable(ProbeError):
    """A source cannot run on this host at all (its binary or library is missing)."""


# How a py-spy reading ends when a steady recording that spans several windows has not ended yet: the window has no
# stacks of its own, and the detector reads the latest finished recording's for it (analysis.steady_stacks).
STEADY_RECORDING_RUNNING = "its stacks come with the window it ends in"
