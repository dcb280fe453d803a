"""The host's side of the decode kernel's token stream: taking the tokens as they land (`follow`), and
how long to wait before looking again for the next one (`TokenWait`).

The decode kernel writes tokens into host-mapped memory at a steady cadence (0.25-6 ms at
these speeds). A plain `time.sleep(50e-6)` between looks really sleeps ~0.1 ms on Linux (timer
slack), so a token is taken up to a slice after it landed: that shows as a ~0.1 ms spread in
the per-token latency (p99 over p50), 10-40% of a token here. Instead the host sleeps in
slices only while the next token is not yet due, and around its due time it merely yields the
core (`os.sched_yield`, which releases the GIL: other threads, the chat UI's among them, still
run), so it takes the token within microseconds. `time.sleep(0)` is no yield: it too sleeps the
timer slack (~56 us on Linux, PERF.md session 9), which spread SmolLM2's token gaps by 18%. If
a token is late the host goes back to sleeping: a stalled kernel does not hold a core.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))  # POSIX; elsewhere sleep(0) is the yield


class TokenWait:
    """The cadence of the tokens seen so far, and the pause it calls for now."""

    def __init__(self, sleep_s: float = 50e-6, early_s: float = 250e-6, late_s: float = 1e-3,
                 smoothing: float = 0.25):
        self.sleep_s = sleep_s  # one look's sleep while the next token is not due
        self.early_s = early_s  # start yielding this long before the next token is due
        self.late_s = late_s  # and stop this long after, if it has not come
        self.smoothing = smoothing  # weight of the newest gap in the running gap per token
        self.longest_s = 5e-3  # the longest single sleep (how late a cancel or the end is seen)
        self.last: float | None = None  # when tokens were last taken
        self.gap: float | None = None  # running gap between tokens

    def seen(self, now: float, count: int) -> None:
        """`count` new tokens were found at `now` (perf_counter seconds)."""
        if count <= 0:
            return
        if self.last is not None:
            gap = (now - self.last) / count
            self.gap = gap if self.gap is None else self.gap + self.smoothing * (gap - self.gap)
        self.last = now

    def pause(self, now: float) -> float:
        """Seconds to sleep before the next look: 0 means only yield."""
        if self.last is None or self.gap is None:
            return self.sleep_s
        due = self.last + self.gap
        if now < due - self.early_s:  # one sleep to just before it is due (a cancel waits at most that)
            return min(max(due - self.early_s - now, self.sleep_s), self.longest_s)
        return 0.0 if now <= due + self.late_s else self.sleep_s

    def rest(self, now: float) -> None:
        """Sleep or only yield, as `pause` says for `now`."""
        pause = self.pause(now)
        if pause > 0:
            time.sleep(pause)
        else:
            _yield()


def follow(tokens: Sequence[int], max_tokens: int, stop_ids: set[int], kernel_ended: Callable[[], bool],
           on_look: Callable[[], None], wait: TokenWait | None = None,
           clock: Callable[[], float] = time.perf_counter) -> Iterator[int]:
    """Yield the tokens a kernel writes into `tokens` (-1 until written) as they land, until
    the kernel has ended, `max_tokens` came or a stop id did. `kernel_ended` is asked before
    each look, so a kernel that has ended has all its tokens visible; `on_look` runs before
    each rest (the caller passes a cancel on)."""
    wait = wait or TokenWait()
    emitted = 0
    while True:
        ended = kernel_ended()
        found = emitted
        while found < max_tokens and tokens[found] >= 0:
            found += 1
        wait.seen(clock(), found - emitted)  # before the consumer runs: its time is not the kernel's
        last = -1
        for i in range(emitted, found):
            last = int(tokens[i])
            yield last
        if ended or found == max_tokens or last in stop_ids:
            return
        on_look()
        if found == emitted:  # (after tokens, look again at once: more may have come while the consumer ran)
            wait.rest(clock())
        emitted = found
