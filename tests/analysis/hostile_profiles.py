"""Seeded random profiles whose frame names use every character that breaks some export format."""

import random

from analysis.flamegraph.profile import Profile

# Separators, markup, controls, digits (a trailing " 12" reads as a count), C1 and line separators.
ALPHABET = list("ab ;<>&\"'\n\t\r\\]]>0123456789.()") + ["\x00", "\x7f", "\u2028", "\x85", "é", "✓", "\ud800"]


def random_hostile_profile(seed: int) -> Profile:
    rng = random.Random(seed)
    prof = Profile()
    for _ in range(rng.randint(1, 40)):
        stack = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(1, 8))]
        prof.add(stack, rng.randint(1, 1000))
    return prof
