"""A shared hypothesis profile for test suites that run on shared, noisy machines."""

from __future__ import annotations

__all__ = ["use_noisy_machine_profile"]


def use_noisy_machine_profile() -> None:
    """Load a hypothesis profile without timing-based failures (no deadline, no "too slow" health check).

    Our suites never assert on time; on a loaded 2-core CI box hypothesis's own timing checks would only add
    flakiness. Examples counts stay whatever each test asks for. Does nothing when hypothesis is not installed.
    """
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the kit's property test is skipped without hypothesis anyway
        return
    settings.register_profile(
        "dsh-noisy-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
    )
    settings.load_profile("dsh-noisy-machine")
