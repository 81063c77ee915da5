"""Restart strategies of `sparkeos run` as decisions on a clock the test holds: delays, resets, giving up."""

from __future__ import annotations

import random

import pytest
import yaml

from sparkeos.jobs.restart import ExponentialDelay, FailureRate, FixedDelay, NoRestart, restart_strategy
from sparkeos.jobs.runner import Supervisor
from sparkeos.jobs.spec import RestartSpec, parse_job


def decisions(strategy, times: list[float]) -> list[float | None]:
    return [strategy.on_failure(now) for now in times]


def test_fixed_delay_gives_up_after_its_attempts():
    assert decisions(FixedDelay(attempts=2, delay_s=5, reset_attempts_threshold_s=100), [0, 10, 20]) == [5, 5, None]
    assert decisions(FixedDelay(attempts=0, delay_s=5, reset_attempts_threshold_s=100), [0]) == [None]


def test_fixed_delay_counts_again_after_a_stable_period():
    """The count starts again when the failed driver had run for the threshold since its restart (failure time +
    delay), and not a moment before."""
    strategy = FixedDelay(attempts=2, delay_s=5, reset_attempts_threshold_s=100)
    assert decisions(strategy, [0, 10]) == [5, 5]  # restarted at 15
    assert strategy.on_failure(114.9) is None  # ran 99.9 s: both attempts are used up
    strategy = FixedDelay(attempts=2, delay_s=5, reset_attempts_threshold_s=100)
    assert decisions(strategy, [0, 10, 115, 125, 135]) == [5, 5, 5, 5, None]


def test_failure_rate_gives_up_on_too_many_failures_in_the_interval():
    # At most 2 failures in 60 s: the third within 60 s of the first fails the job.
    assert decisions(FailureRate(2, interval_s=60, delay_s=3), [0, 10, 60]) == [3, 3, None]
    # Spread out, failures go on being restarted; the window slides with the last three failures.
    assert decisions(FailureRate(2, interval_s=60, delay_s=3), [0, 10, 60.5, 71, 120]) == [3, 3, 3, 3, None]
    assert decisions(FailureRate(1, interval_s=60, delay_s=0), [0, 61, 122, 123]) == [0, 0, 0, None]


def test_exponential_delay_grows_to_its_cap_and_falls_back_after_a_stable_period():
    strategy = ExponentialDelay(initial_backoff_s=1, max_backoff_s=10, backoff_multiplier=2,
                                reset_backoff_threshold_s=100, jitter_factor=0, attempts_before_reset_backoff=None)
    times, now, delays = [], 0.0, []
    for _ in range(6):
        times.append(now)
        delays.append(strategy.on_failure(now))
        now += delays[-1] + 1  # each restarted driver fails a second after its start
    assert delays == [1, 2, 4, 8, 10, 10]
    restarted = times[-1] + 10
    assert strategy.on_failure(restarted + 99) == 10  # not stable for long enough
    restarted += 99 + 10
    assert strategy.on_failure(restarted + 100) == 1  # ran 100 s: back to the initial backoff
    assert strategy.on_failure(restarted + 100 + 1 + 1) == 2


def test_exponential_delay_attempts_before_reset_backoff():
    strategy = ExponentialDelay(1, 60, 1.5, reset_backoff_threshold_s=30, jitter_factor=0,
                                attempts_before_reset_backoff=3)
    assert decisions(strategy, [0, 2, 5]) == [1, 1.5, 2.25]
    assert strategy.on_failure(8) is None
    strategy = ExponentialDelay(1, 60, 1.5, reset_backoff_threshold_s=30, jitter_factor=0,
                                attempts_before_reset_backoff=3)
    assert decisions(strategy, [0, 2, 5, 7.25 + 30]) == [1, 1.5, 2.25, 1]  # the row ended: three more allowed


def test_exponential_delay_jitter_stays_within_its_factor_and_the_bounds():
    strategy = ExponentialDelay(2, 20, 2, reset_backoff_threshold_s=1e9, jitter_factor=0.5,
                                attempts_before_reset_backoff=None, rng=random.Random(5))
    delays = decisions(strategy, [float(i) for i in range(40)])
    for attempt, delay in enumerate(delays):
        backoff = min(2 * 2 ** attempt, 20)
        assert max(2, backoff * 0.5) <= delay <= min(backoff * 1.5, 20)
    assert len({round(d, 6) for d in delays[5:]}) > 5, "jitter varies the capped delays"


def test_exponential_delay_never_overflows():
    strategy = ExponentialDelay(0.1, 60, 1.5, 3600, 0, None)
    assert decisions(strategy, [float(i) for i in range(5000)])[-1] == 60


def test_no_restart():
    assert NoRestart().on_failure(0) is None


def test_the_job_file_options_reach_the_strategies():
    def restart(**options) -> RestartSpec:
        return parse_job({"source": {"kafka.bootstrap.servers": "b:1", "subscribe": "t"}, "sink": {"topic": "o"},
                          "checkpoint": "/ck", "restart": options}).restart

    assert restart() == RestartSpec("fixed-delay", attempts=3, delay_s=10, reset_attempts_threshold_s=3600)
    fixed = restart(strategy="fixed-delay", attempts=4, delay="0 s", **{"reset-attempts-threshold": "10 minutes"})
    assert (fixed.attempts, fixed.delay_s, fixed.reset_attempts_threshold_s) == (4, 0, 600)
    rate = restart(strategy="failure-rate", **{"max-failures-per-interval": 5, "failure-rate-interval": "2 min",
                                               "delay": "500 ms"})
    assert (rate.max_failures_per_interval, rate.failure_rate_interval_s, rate.delay_s) == (5, 120, 0.5)
    assert isinstance(restart_strategy(rate), FailureRate)
    assert (restart(strategy="failure-rate").max_failures_per_interval, restart(strategy="failure-rate").delay_s,
            restart(strategy="failure-rate").failure_rate_interval_s) == (1, 1, 60)  # Flink's defaults
    exponential = restart(strategy="exponential-delay", **{
        "initial-backoff": "2 s", "max-backoff": "3 min", "backoff-multiplier": 3, "reset-backoff-threshold": "2 h",
        "jitter-factor": 0, "attempts-before-reset-backoff": 7})
    assert (exponential.initial_backoff_s, exponential.max_backoff_s, exponential.backoff_multiplier,
            exponential.reset_backoff_threshold_s, exponential.jitter_factor,
            exponential.attempts_before_reset_backoff) == (2, 180, 3, 7200, 0, 7)
    defaults = restart(strategy="exponential-delay")  # Flink's defaults
    assert (defaults.initial_backoff_s, defaults.max_backoff_s, defaults.backoff_multiplier,
            defaults.reset_backoff_threshold_s, defaults.jitter_factor,
            defaults.attempts_before_reset_backoff) == (1, 60, 1.5, 3600, 0.1, None)
    assert restart(strategy="none").attempts == 0 and isinstance(restart_strategy(restart(strategy="none")), NoRestart)


def test_the_supervisor_decides_on_its_clock(tmp_path):
    """The supervisor asks the job's strategy at the time of its clock; nothing is started here."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "source": {"kafka.bootstrap.servers": "b:1", "subscribe": "t"}, "sink": {"topic": "o"}, "checkpoint": "/ck",
        "restart": {"strategy": "exponential-delay", "initial-backoff": "1 s", "backoff-multiplier": 2,
                    "jitter-factor": 0, "reset-backoff-threshold": "1 minute"}}))
    now = [1000.0]
    supervisor = Supervisor(str(job), master="local[1]", clock=lambda: now[0])
    assert supervisor.next_delay() == 1
    now[0] += 2
    assert supervisor.next_delay() == 2
    now[0] += 2 + 60
    assert supervisor.next_delay() == 1


@pytest.mark.parametrize("strategy", ["fixed-delay", "failure-rate", "exponential-delay", "none"])
def test_every_strategy_describes_itself(strategy):
    assert restart_strategy(RestartSpec(strategy)).describe().startswith(strategy)
