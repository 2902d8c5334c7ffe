"""Parse the load schedule (RATE:SECONDS,...) and the sweep (setting=v1,v2,...) given on the command line."""

from __future__ import annotations

from dataclasses import dataclass

MAX_STEP_S = 600.0
MAX_RATE = 10_000.0
SWEEP_SETTINGS = {"max-batch": "--max-batch", "http-threads": "--http-threads"}


@dataclass(frozen=True)
class Step:
    rate: float  # requests per second offered (Poisson arrivals)
    seconds: float


def parse_schedule(text: str) -> tuple[Step, ...]:
    """'2:15,4:15,8:15' -> three steps; ValueError quoting the bad part otherwise."""
    if not text or not text.strip():
        raise ValueError("schedule is empty; expected RATE:SECONDS,... e.g. 2:15,4:15,8:15")
    steps = []
    for part in text.split(","):
        rate_s, sep, seconds_s = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            rate, seconds = float(rate_s), float(seconds_s)
        except ValueError:
            raise ValueError(f"schedule part {part.strip()!r} is not RATE:SECONDS (e.g. 4:15)") from None
        if not 0 < rate <= MAX_RATE:
            raise ValueError(f"schedule part {part.strip()!r}: rate must be within (0, {MAX_RATE:g}] req/s")
        if not 1 <= seconds <= MAX_STEP_S:
            raise ValueError(f"schedule part {part.strip()!r}: seconds must be within [1, {MAX_STEP_S:g}]")
        steps.append(Step(rate, seconds))
    return tuple(steps)


def parse_range(text: str, what: str) -> tuple[int, int]:
    """'N' or 'MIN-MAX' with 1 <= MIN <= MAX."""
    low, _, high = text.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise ValueError(f"{what} must be N or MIN-MAX, got {text!r}") from None
    if bounds[0] < 1 or bounds[0] > bounds[1]:
        raise ValueError(f"{what} must be N or MIN-MAX with 1 <= MIN <= MAX, got {text!r}")
    return bounds


@dataclass(frozen=True)
class Sweep:
    setting: str  # one of SWEEP_SETTINGS
    values: tuple[int, ...]

    @property
    def server_flag(self) -> str:
        return SWEEP_SETTINGS[self.setting]


def parse_sweep(text: str) -> Sweep:
    """'max-batch=1,2,4,8' -> Sweep('max-batch', (1, 2, 4, 8))."""
    setting, sep, values = text.partition("=")
    if not sep or setting not in SWEEP_SETTINGS:
        raise ValueError(f"sweep {text!r} is not SETTING=V1,V2,... with SETTING one of {', '.join(SWEEP_SETTINGS)}")
    try:
        parsed = tuple(int(v) for v in values.split(","))
    except ValueError:
        raise ValueError(f"sweep values {values!r} must be whole numbers, e.g. 1,2,4,8") from None
    if not parsed or any(v < 1 or v > 1024 for v in parsed):
        raise ValueError(f"sweep values {values!r} must be within [1, 1024]")
    return Sweep(setting, parsed)
