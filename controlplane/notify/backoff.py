"""When to try a delivery again, or to give up on it: a pure function of the attempt.

Any answer other than 2xx, and any failure to get one (refused connection, timeout,
an answer too large), is retried: a receiver that refuses today (a secret being
rotated, a deploy) may accept tomorrow, and at-least-once means not dropping what it
could still take. Retries wait out the shared backoff (kernel/backoff.py) with half
the delay random, so the delay still grows while retries of many deliveries spread
out; a `Retry-After` the receiver sent lengthens the delay, never shortens
it. A delivery that used up its attempts, or would be retried after its maximum age,
is given up (`failed`), and stays visible as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.backoff import BackoffPolicy


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 12
    max_age_sec: float = 24 * 3600.0
    base_delay_sec: float = 2.0
    max_delay_sec: float = 900.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 100:
            raise ValueError("max_attempts must be 1..100")
        if not 0 < self.base_delay_sec <= self.max_delay_sec <= self.max_age_sec:
            raise ValueError("need 0 < base_delay_sec <= max_delay_sec <= max_age_sec")

    @property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(initial=self.base_delay_sec, maximum=self.max_delay_sec, jitter=0.5)


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt got: an HTTP status, or an error that kept it from one."""

    status: int | None
    error: str | None = None
    retry_after_sec: float | None = None
    # not sent at all: the URL, or an address its name resolved to, is refused
    refused: bool = False

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        if self.status is not None:
            return f"HTTP {self.status}"
        return self.error or "no answer"


@dataclass(frozen=True)
class Delivered:
    pass


@dataclass(frozen=True)
class RetryAt:
    at: float
    delay_sec: float


@dataclass(frozen=True)
class GiveUp:
    reason: str


Verdict = Delivered | RetryAt | GiveUp


def retry_delay(policy: RetryPolicy, attempts: int, jitter: float) -> float:
    """The pause after the `attempts`-th failed attempt (1-based); `jitter` in [0, 1)."""
    if attempts < 1:
        raise ValueError("attempts start at 1")
    if not 0.0 <= jitter < 1.0:
        raise ValueError("jitter must be in [0, 1)")
    # the policy takes a share off as its draw grows; here jitter 0 is the shortest
    # delay (half the ceiling) and the delay grows with it
    return policy.backoff.delay(attempts, 1.0 - jitter)


def after_attempt(
    policy: RetryPolicy,
    *,
    result: AttemptResult,
    attempts: int,
    queued_at: float,
    now: float,
    jitter: float,
) -> Verdict:
    """What becomes of a delivery after its `attempts`-th attempt got `result`."""
    if result.delivered:
        return Delivered()
    if attempts >= policy.max_attempts:
        return GiveUp(f"gave up after {attempts} attempts; last: {result.describe()}")
    delay = retry_delay(policy, attempts, jitter)
    if result.retry_after_sec is not None and result.retry_after_sec > 0:
        delay = max(delay, min(result.retry_after_sec, policy.max_delay_sec))
    at = now + delay
    if at - queued_at > policy.max_age_sec:
        return GiveUp(
            f"gave up: older than {policy.max_age_sec:g}s at the next attempt; "
            f"last: {result.describe()}"
        )
    return RetryAt(at=at, delay_sec=delay)


def parse_retry_after(value: str | None) -> float | None:
    """A `Retry-After` given in seconds (1..86400); dates and anything else: None."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or len(text) > 6:
        return None
    seconds = int(text)
    return float(seconds) if 1 <= seconds <= 86_400 else None
