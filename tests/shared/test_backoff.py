"""Retry delays (superagent_shared.backoff): the one module both programs use."""

from __future__ import annotations

from superagent_shared.backoff import Backoff, delay


def test_delay_doubles_from_the_base_up_to_the_cap() -> None:
    assert [delay(n, base=0.5, cap=3.0, jitter=0) for n in range(1, 6)] == [0.5, 1, 2, 3, 3]
    assert delay(0, jitter=0) == 1.0  # (not before the first retry: as the first)
    assert delay(10**9, cap=60.0, jitter=0) == 60.0  # no overflow, however many retries


def test_delay_jitter_stays_within_its_band() -> None:
    seen = [delay(4, base=1.0, jitter=0.2) for _ in range(500)]
    assert all(6.4 <= d <= 9.6 for d in seen)
    assert len(set(seen)) > 1  # jittered, not in step


def test_backoff_counts_its_attempts_and_resets() -> None:
    redial = Backoff(initial=1.0, factor=1.6, cap=3.0, jitter=0)
    assert [redial.next_delay() for _ in range(4)] == [1.0, 1.6, 1.6 * 1.6, 3.0]
    assert redial.attempt == 4
    redial.reset()
    assert redial.peek() == 1.0


def test_backoff_grows_by_1_6_with_jitter_and_caps() -> None:
    backoff = Backoff()
    delays = [backoff.next_delay() for _ in range(20)]
    for attempt, waited in enumerate(delays):
        base = min(120.0, 1.6**attempt)
        assert base * 0.8 <= waited <= base * 1.2
    assert max(delays) <= 144
    backoff.reset()
    assert 0.8 <= backoff.next_delay() <= 1.2
