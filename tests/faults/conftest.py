"""Fault-suite fixtures: `fault(category, injection, cases=1)` records what a test injected.

Records go to the test's `user_properties` (as pytest's own `record_property` does), so
`scripts/reliability_report.py` can collect them with the outcome of each test and regenerate
docs/reliability.md. Nothing is recorded for a test that fails before calling it.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def fault(record_property):
    """Call as fault("crash", "SIGKILL before the manifest; sync save, local disk", cases=1)."""

    def record(category: str, injection: str, cases: int = 1, detail: str = "") -> None:
        record_property(
            "fault",
            {"category": category, "injection": injection, "cases": cases, "detail": detail},
        )

    return record
