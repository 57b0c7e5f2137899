"""The pieces of a retention policy string (ckptflow.core.retention): durations such as ``7d``
and thinning tiers ``AGE:EVERY``, parsed and checked; PolicyError for what a user wrote wrong.

Pure Python (no torch), like retention.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhdw])")


class PolicyError(ValueError):
    """A retention policy or duration the user wrote that cannot be used; the message says why."""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``30m``, ``2h``, ``1.5d`` or ``1w``."""
    m = _DURATION.fullmatch(text.strip().lower())
    if not m or float(m[1]) <= 0:
        raise PolicyError(
            f"bad duration {text!r}: write a positive number and a unit s, m, h, d or w (e.g. 7d)"
        )
    return float(m[1]) * _UNITS[m[2]]


@dataclass(frozen=True)
class Tier:
    """One thinning tier: entries younger than max_age keep one per `every` seconds (None: all)."""

    max_age: float  # upper age limit in seconds (math.inf for '*')
    every: float | None  # bucket width in seconds; None keeps every entry
    age_label: str  # the AGE as written ('2h', '*')
    every_label: str  # the EVERY as written ('1h', 'all')


def _parse_tiers(spec: str) -> tuple[Tier, ...]:
    parts = [p.strip() for p in re.split(r"[,/]", spec) if p.strip()]
    if not parts:
        raise PolicyError(f"empty thinning spec {spec!r}: write e.g. 2h:all,1d:1h,7d:1d,*:7d")
    tiers: list[Tier] = []
    for part in parts:
        age_text, sep, every_text = part.partition(":")
        age_text, every_text = age_text.strip().lower(), every_text.strip().lower()
        if not sep or not age_text or not every_text:
            raise PolicyError(f"thinning tier {part!r} must be AGE:EVERY, e.g. 1d:1h or *:7d")
        if tiers and tiers[-1].max_age == math.inf:
            raise PolicyError(f"thinning tier {part!r} follows '*': the '*' tier must be last")
        age = math.inf if age_text == "*" else parse_duration(age_text)
        every = None if every_text == "all" else parse_duration(every_text)
        if tiers and age <= tiers[-1].max_age:
            raise PolicyError(
                f"thinning tiers must have increasing ages: {age_text} follows {tiers[-1].age_label}"
            )
        tiers.append(Tier(age, every, age_text, every_text))
    return tuple(tiers)
