"""Restart strategies of `sparkeos run`: Flink's fixed-delay, failure-rate and exponential-delay, as pure decisions.

Each strategy is told of every failure of the driver, with the time it happened on a monotonic clock in seconds,
and answers with the delay before the driver starts again, or None when the job has failed for good. The
supervisor owns the clock, so the decisions can be checked with any sequence of failure times.

- fixed-delay: `attempts` restarts, `delay` apart. The count starts again from zero when the driver that failed had
  run for at least `reset-attempts-threshold` since its restart (the failure came that long after the restart's
  planned time), so a job that fails now and then, hours apart, is not worn down by failures long past.
- failure-rate: restarts `delay` after each failure, unless this failure is the (max-failures-per-interval + 1)th
  within `failure-rate-interval` (the oldest of the last max + 1 failures is no older than the interval): then
  the job fails.
- exponential-delay: the n-th restart in a row waits initial-backoff * backoff-multiplier^(n-1), plus or minus up
  to jitter-factor of that, capped to [initial-backoff, max-backoff]. The row ends, and the backoff falls back to
  initial-backoff, when the driver that failed had run for at least reset-backoff-threshold since its restart.
  With attempts-before-reset-backoff, a row of more failures than that fails the job.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Protocol

from .spec import RestartSpec, seconds_text


class RestartStrategy(Protocol):
    def on_failure(self, now: float) -> float | None:
        """The driver failed at `now`: seconds to wait before starting it again, or None to give up."""

    def describe(self) -> str:
        """The strategy and its settings, for log lines and errors."""


class NoRestart:
    def on_failure(self, now: float) -> float | None:
        return None

    def describe(self) -> str:
        return "none (never restarts)"


class FixedDelay:
    def __init__(self, attempts: int, delay_s: float, reset_attempts_threshold_s: float):
        self.attempts = attempts
        self.delay_s = delay_s
        self.reset_attempts_threshold_s = reset_attempts_threshold_s
        self.count = 0
        self.restarted_at: float | None = None

    def on_failure(self, now: float) -> float | None:
        if self.restarted_at is not None and now - self.restarted_at >= self.reset_attempts_threshold_s:
            self.count = 0
        if self.count >= self.attempts:
            return None
        self.count += 1
        self.restarted_at = now + self.delay_s
        return self.delay_s

    def describe(self) -> str:
        return (f"fixed-delay ({self.attempts} attempts, {seconds_text(self.delay_s)} apart, counted again after "
                f"{seconds_text(self.reset_attempts_threshold_s)} without a failure)")


class FailureRate:
    def __init__(self, max_failures_per_interval: int, interval_s: float, delay_s: float):
        self.max_failures = max_failures_per_interval
        self.interval_s = interval_s
        self.delay_s = delay_s
        self.failures: deque[float] = deque(maxlen=max_failures_per_interval + 1)

    def on_failure(self, now: float) -> float | None:
        self.failures.append(now)
        if len(self.failures) > self.max_failures and now - self.failures[0] <= self.interval_s:
            return None
        return self.delay_s

    def describe(self) -> str:
        return (f"failure-rate (at most {self.max_failures} failures in {seconds_text(self.interval_s)}, "
                f"{seconds_text(self.delay_s)} apart)")


class ExponentialDelay:
    def __init__(self, initial_backoff_s: float, max_backoff_s: float, backoff_multiplier: float,
                 reset_backoff_threshold_s: float, jitter_factor: float, attempts_before_reset_backoff: int | None,
                 rng: random.Random | None = None):
        self.initial_s = initial_backoff_s
        self.max_s = max_backoff_s
        self.multiplier = backoff_multiplier
        self.reset_threshold_s = reset_backoff_threshold_s
        self.jitter = jitter_factor
        self.attempts = attempts_before_reset_backoff
        self.rng = rng or random.Random()
        self.attempt = 0  # restarts in the current row
        self.restarted_at: float | None = None

    def on_failure(self, now: float) -> float | None:
        if self.restarted_at is not None and now - self.restarted_at >= self.reset_threshold_s:
            self.attempt = 0
        if self.attempts is not None and self.attempt >= self.attempts:
            return None
        # The exponent stops where the backoff reaches the cap: past it the power would overflow a float.
        exponent = min(self.attempt, math.ceil(math.log(self.max_s / self.initial_s, self.multiplier)) + 1)
        backoff = min(self.initial_s * self.multiplier ** exponent, self.max_s)
        offset = backoff * self.jitter
        delay = max(self.initial_s, min(backoff + self.rng.uniform(-offset, offset), self.max_s))
        self.attempt += 1
        self.restarted_at = now + delay
        return delay

    def describe(self) -> str:
        limit = f", at most {self.attempts} in a row" if self.attempts is not None else ""
        return (f"exponential-delay ({seconds_text(self.initial_s)} to {seconds_text(self.max_s)}, "
                f"x{self.multiplier:g}, jitter {self.jitter:g}, reset after {seconds_text(self.reset_threshold_s)} "
                f"without a failure{limit})")


def restart_strategy(spec: RestartSpec, rng: random.Random | None = None) -> RestartStrategy:
    if spec.strategy == "none":
        return NoRestart()
    if spec.strategy == "fixed-delay":
        return FixedDelay(spec.attempts, spec.delay_s, spec.reset_attempts_threshold_s)
    if spec.strategy == "failure-rate":
        return FailureRate(spec.max_failures_per_interval, spec.failure_rate_interval_s, spec.delay_s)
    if spec.strategy == "exponential-delay":
        return ExponentialDelay(spec.initial_backoff_s, spec.max_backoff_s, spec.backoff_multiplier,
                                spec.reset_backoff_threshold_s, spec.jitter_factor, spec.attempts_before_reset_backoff,
                                rng)
    raise ValueError(f"unknown restart strategy {spec.strategy!r}")
