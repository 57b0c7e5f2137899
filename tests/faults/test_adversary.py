"""The adversarial model of the storage (issue 14), run as hypothesis state machines.

Each variant is the machine of `tests/faults/adversary/` with some rule groups: random sequences
of saves, loads, tools and damage, with the invariants of tests/faults/adversary/truth.py checked after
every operation. Default run: a few dozen sequences per variant (derandomized, no shrinking, so
a known failure costs little); `CKPTFLOW_ADVERSARY_EXAMPLES=N` sets the count,
`CKPTFLOW_ADVERSARY_SHRINK=1` shrinks a failure to a minimal sequence; `-m slow` runs 10,000
sequences of the full machine and of the races variant on local disk (and 500 on S3).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.faults.adversary import GROUPS, make_machine

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

VARIANTS = {
    "baseline": ("gc",),  # no damage: the model must find nothing
    "objects": ("gc", "objects"),
    "markers": ("gc", "json", "folders"),
    "archive": ("gc", "archive", "crash"),
    "inflight": ("gc", "inflight"),
    "names": ("names",),
    "races": ("gc", "races"),  # loads racing commits, GC and archive (issue 37)
    "all": GROUPS,
}
# Variants that find a defect the current engine still has, each replayed (minimal) in
# tests/faults/test_adversary_replays.py; strict: once it is fixed the mark must go.
KNOWN: dict[str, str] = {}

DEFAULT_EXAMPLES = {"local": 30, "s3": 6}
STEPS = 12


def _settings(backend: str, slow: bool = False) -> settings:
    env = os.environ.get("CKPTFLOW_ADVERSARY_EXAMPLES")
    n = (
        int(env)
        if env
        else ((10_000 if backend == "local" else 500) if slow else DEFAULT_EXAMPLES[backend])
    )
    shrink = slow or os.environ.get("CKPTFLOW_ADVERSARY_SHRINK") == "1"
    phases = [Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if shrink else [])]
    return settings(
        max_examples=n,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=not slow,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )


def _run(variant: str, backend: str, fault, bucket: str | None = None, slow: bool = False) -> None:
    machine = make_machine(variant, VARIANTS[variant], backend, bucket)
    try:
        run_state_machine_as_test(machine, settings=_settings(backend, slow))
    finally:
        where = "local disk" if backend == "local" else "in-process S3"
        fault(
            "adversary",
            f"adversarial sequences, variant {variant} ({', '.join(VARIANTS[variant])}); {where}"
            + (" (slow run)" if slow else ""),
            cases=machine.stats.sequences,
            detail=machine.stats.detail(),
        )


def _param(variant: str, backend: str):
    key = f"{variant}-{backend}"
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN[key])] if key in KNOWN else []
    return pytest.param(variant, id=variant, marks=marks)


@pytest.mark.parametrize("variant", [_param(v, "local") for v in VARIANTS])
def test_adversary_local(variant, fault):
    _run(variant, "local", fault)


@pytest.mark.s3
@pytest.mark.parametrize("variant", [_param("all", "s3")])
def test_adversary_s3(variant, s3_bucket, fault):
    _run(variant, "s3", fault, bucket=s3_bucket)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["all", "races"])
def test_adversary_slow_local(variant, fault):
    _run(variant, "local", fault, slow=True)


@pytest.mark.slow
@pytest.mark.s3
def test_adversary_slow_s3(s3_bucket, fault):
    _run("all", "s3", fault, bucket=s3_bucket, slow=True)
