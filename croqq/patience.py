"""Waits that stretch with the machine's load: a deadline that fails only when the event never comes.

A budget is counted in *unloaded* seconds. Each poll charges the wall time since the last one divided by
the machine's slowness (the 1-minute load average per CPU, at least 1), so a 60 s budget lasts 60 s on an
idle machine and about 5 minutes on a 2-core machine running ten busy processes. ``CROQQ_PATIENCE``
multiplies every budget (a shared CI host may set it; default 1).

Used where croqq waits for its own processes (``croqq up`` waiting for its GPU workers, ``croqq submit``
waiting for the writer, the stress and multi-host harnesses, the tests): how long recovery or start-up
takes is a benchmark figure, never a reason to fail. Not for leases or Redis-clock deadlines, which must
not stretch. A base module: every layer may import it, and it imports none.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def slowness() -> float:
    """How many times slower than an idle machine this one runs now (>= 1)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def scale() -> float:
    """``CROQQ_PATIENCE``: a factor on every budget (default 1)."""
    raw = os.environ.get("CROQQ_PATIENCE", "")
    try:
        value = float(raw) if raw else 1.0
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0


class Deadline:
    """``budget_s`` unloaded seconds from now; ``expired()`` polls (charging the time since the last poll
    at the slowness of now)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s * scale()
        self.started = self._last = time.monotonic()
        self._spent = 0.0

    def expired(self) -> bool:
        now = time.monotonic()
        self._spent += (now - self._last) / slowness()
        self._last = now
        return self._spent > self.budget_s

    @property
    def waited_s(self) -> float:
        """Wall seconds since the deadline was set."""
        return time.monotonic() - self.started


def wait_until(check: Callable[[], T], budget_s: float, what: str, every_s: float = 0.1) -> T:
    """Poll ``check`` until it returns something truthy and return that; TimeoutError naming ``what``
    once ``budget_s`` unloaded seconds have passed without it."""
    deadline = Deadline(budget_s)
    while True:
        value = check()
        if value:
            return value
        if deadline.expired():
            raise TimeoutError(
                f"{what}: not within {deadline.waited_s:.0f} s (budget {budget_s:g} s at load)"
            )
        time.sleep(every_s)
