"""The host's wait for the GPU's next token (engine/backends/token_wait.py): a pure policy over
given times, so these tests pass times in and never sleep."""

from __future__ import annotations

import pytest

from engine.backends.token_wait import TokenWait, follow


def steady(wait: TokenWait, gap: float, tokens: int, t0: float = 10.0) -> float:
    """Tokens taken one by one every `gap` seconds from t0; returns the last time."""
    t = t0
    for i in range(tokens):
        t = t0 + i * gap
        wait.seen(t, 1)
    return t


def test_sleeps_in_slices_until_a_cadence_is_known():
    wait = TokenWait(sleep_s=50e-6)
    assert wait.pause(1.0) == 50e-6
    wait.seen(1.0, 1)
    assert wait.pause(1.0001) == 50e-6  # one token: no gap yet


def test_yields_around_the_due_time_and_sleeps_before_it():
    wait = TokenWait(sleep_s=50e-6, early_s=250e-6, late_s=1e-3)
    last = steady(wait, 1e-3, 10)
    assert wait.gap == pytest.approx(1e-3)
    # right after a token: sleep until shortly before the next one is due
    assert wait.pause(last + 10e-6) == pytest.approx(1e-3 - 250e-6 - 10e-6)
    # inside the window: only yield
    assert wait.pause(last + 800e-6) == 0.0
    assert wait.pause(last + 1e-3) == 0.0
    assert wait.pause(last + 1.9e-3) == 0.0
    # a token this late: back to sleeping in slices (a stalled kernel holds no core)
    assert wait.pause(last + 2.5e-3) == 50e-6


def test_sleep_is_bounded_for_slow_cadences():
    wait = TokenWait(sleep_s=50e-6)
    last = steady(wait, 0.1, 5)  # 10 tok/s
    assert wait.pause(last) == wait.longest_s
    # never shorter than one slice when the window is close
    assert wait.pause(last + 0.1 - 250e-6 - 10e-6) == 50e-6


def test_tokens_taken_together_count_as_that_many_gaps():
    wait = TokenWait(smoothing=1.0)
    wait.seen(1.0, 1)
    wait.seen(1.004, 4)  # four tokens were waiting: 1 ms each
    assert wait.gap == pytest.approx(1e-3)
    wait.seen(1.005, 0)  # nothing new: nothing changes
    assert wait.last == 1.004


def test_the_running_gap_follows_a_change_of_pace():
    wait = TokenWait(smoothing=0.25)
    last = steady(wait, 1e-3, 20)
    for i in range(1, 30):
        wait.seen(last + i * 0.5e-3, 1)
    assert wait.gap == pytest.approx(0.5e-3, rel=0.01)


def test_rest_yields_inside_the_window_and_sleeps_outside(monkeypatch):
    import engine.backends.token_wait as token_wait

    calls = []
    monkeypatch.setattr(token_wait.time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setattr(token_wait, "_yield", lambda: calls.append(("yield",)))
    wait = TokenWait(sleep_s=50e-6, early_s=250e-6, late_s=1e-3)
    last = steady(wait, 1e-3, 10)
    wait.rest(last + 10e-6)
    wait.rest(last + 900e-6)  # due soon: time.sleep(0) would sleep the timer slack (~56 us)
    assert calls == [("sleep", pytest.approx(1e-3 - 250e-6 - 10e-6)), ("yield",)]


class Kernel:
    """Tokens landing every `gap` seconds of a fake clock that sleeps and yields advance."""

    def __init__(self, gap: float, count: int):
        self.now = 0.0
        self.due = [(i + 1) * gap for i in range(count)]

    def __getitem__(self, i: int) -> int:
        return 100 + i if self.due[i] <= self.now else -1

    def ended(self) -> bool:
        return self.due[-1] <= self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def follow_with_fake_clock(monkeypatch, kernel: Kernel, stop_ids=frozenset()):
    import engine.backends.token_wait as token_wait

    monkeypatch.setattr(token_wait.time, "sleep", kernel.advance)
    monkeypatch.setattr(token_wait, "_yield", lambda: kernel.advance(2e-6))
    looks = []
    tokens = follow(kernel, len(kernel.due), set(stop_ids), kernel.ended, lambda: looks.append(kernel.now),
                    clock=lambda: kernel.now)
    return tokens, looks


def test_follow_takes_every_token_soon_after_it_lands(monkeypatch):
    kernel = Kernel(gap=2.5e-3, count=40)
    tokens, _ = follow_with_fake_clock(monkeypatch, kernel)
    late = []
    for i, token in enumerate(tokens):
        assert token == 100 + i
        late.append(kernel.now - kernel.due[i])
        kernel.advance(1e-3 if i == 10 else 20e-6)  # the consumer: once it takes 1 ms
    assert len(late) == 40
    # the slow consumer delays nothing after it: the next due time counts from when token 10 was found
    assert max(late[3:]) < 60e-6


def test_follow_stops_at_a_stop_id_and_passes_cancels_on_while_waiting(monkeypatch):
    kernel = Kernel(gap=1e-3, count=10)
    tokens, looks = follow_with_fake_clock(monkeypatch, kernel, stop_ids={103})
    assert list(tokens) == [100, 101, 102, 103]
    assert looks and all(t < kernel.due[3] for t in looks)
