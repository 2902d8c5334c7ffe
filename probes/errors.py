"""Domain errors for probes: each says why a probe cannot run, in words a user can act on."""


class ProbeError(Exception):
    """Base class: a probe could not start or read."""


class ProbeUnavailable(ProbeError):
    """The probe cannot run on this host (no BCC, no BPF, tracepoint missing, compile failure)."""


class NotRoot(ProbeUnavailable):
    """Loading BPF programs needs root (CAP_BPF + CAP_PERFMON)."""


class TracepointMissing(ProbeUnavailable):
    """A tracepoint the probe attaches to does not exist in this kernel's tracefs."""


class SymbolNotFound(ProbeUnavailable):
    """A uprobe target symbol is not in the binary or library."""


class Unsupported(ProbeUnavailable):
    """The target cannot be traced by this probe (e.g. an interpreter without the needed symbol)."""


class TargetGone(ProbeError):
    """The target process exited."""


class AccessDenied(ProbeError):
    """The OS refused access to the target process."""
