"""The guard's shed answers: made once, made again when the config changes them."""

from __future__ import annotations

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.overload import OverloadConfig
from sidecar.overload.guard import OverloadGuard


def test_shed_answers_are_reused_until_the_config_changes_them() -> None:
    clock = FakeClock()
    guard = OverloadGuard(
        OverloadConfig(),
        monotonic=clock.monotonic,
        call_later=lambda d, c: None,  # type: ignore[arg-type, return-value]
    )
    first, status = guard.shed_response("over_limit", "canary", "exp-1", close=False)
    again, _ = guard.shed_response("over_limit", "canary", "exp-1", close=False)
    assert status == 429 and again is first
    closing, _ = guard.shed_response("over_limit", "canary", "exp-1", close=True)
    assert closing.endswith(first[first.index(b"\r\n\r\n") :])
    assert b"Connection: close" in closing and b"Connection: close" not in first
    other, _ = guard.shed_response("queue_timeout", "canary", None, close=False)
    assert b"queue_timeout" in other and b"experiment" not in other

    guard.configure(OverloadConfig(shed_status=503, retry_after_s=9))
    changed, status = guard.shed_response("over_limit", "canary", "exp-1", close=False)
    assert status == 503
    assert changed.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"Retry-After: 9\r\n" in changed
