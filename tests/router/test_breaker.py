from __future__ import annotations

from radixmesh.router.breaker import CircuitBreaker


def test_opens_after_consecutive_failures_then_half_opens() -> None:
    now = [0.0]
    b = CircuitBreaker(failures=2, cooldown=5.0, clock=lambda: now[0])
    b.record_failure()
    assert b.state == "closed"
    b.record_success()
    b.record_failure()
    b.record_failure()
    assert b.state == "open" and not b.allows()
    now[0] = 5.0
    assert b.state == "half_open" and b.allows()
    b.record_failure()  # a failed trial opens it again
    assert b.state == "open"
    now[0] = 10.0
    b.record_success()
    assert b.state == "closed" and b.consecutive_failures == 0
