"""Waits that stretch with the machine's load: a deadline that fails only when the event never comes.

A budget is counted in *unloaded* seconds. Each poll charges the wall time since the last one divided by
the machine's slowness (the 1-minute load average per CPU, at least 1), so a budget lasts longer on a
machine busier than its CPUs can serve. ``CROQQ_PATIENCE`` multiplies every budget (a shared CI host may
set it; default 1); a value that is not a positive number is refused, never ignored.

Used where croqq waits for its own processes (``croqq up`` waiting for its GPU workers, ``croqq submit``
waiting for the writer, the stress and multi-host harnesses, the tests): how long recovery or start-up
takes is a benchmark figure, never a reason to fail. A bound that must not stretch (a lease on Redis's clock,
a stop grace promised to the operator) passes ``wall=True``: plain wall seconds, no load, no
``CROQQ_PATIENCE``. A base module: every layer may import it, and it imports none.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import TypeVar

from croqq.errors import ConfigError

T = TypeVar("T")
LOAD_EVERY_S = 1.0  # a deadline reads the load average at most this often


def slowness() -> float:
    """How many times slower than an idle machine this one runs now (>= 1)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def scale() -> float:
    """``CROQQ_PATIENCE``: a factor on every budget (default 1); ConfigError unless a positive number."""
    raw = os.environ.get("CROQQ_PATIENCE", "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise ConfigError(
            f"CROQQ_PATIENCE={raw!r} is not a positive number: use a factor such as 2, or unset it"
        )
    return value


class Deadline:
    """``budget_s`` unloaded seconds from now; ``expired()`` polls (charging the time since the last poll
    at the slowness of now, read at most every :data:`LOAD_EVERY_S`). ``wall=True``: ``budget_s`` plain
    wall seconds, neither stretched by load nor scaled by ``CROQQ_PATIENCE``."""

    def __init__(self, budget_s: float, *, wall: bool = False) -> None:
        self.wall = wall
        self.budget_s = budget_s if wall else budget_s * scale()
        self.started = self._last = time.monotonic()
        self._spent = 0.0
        self._slowness, self._read_at = 1.0, -math.inf

    def expired(self) -> bool:
        now = time.monotonic()
        if self.wall:
            return now - self.started >= self.budget_s  # a budget of 0 checks once, never waits
        if now - self._read_at >= LOAD_EVERY_S:
            self._slowness, self._read_at = slowness(), now
        self._spent += (now - self._last) / self._slowness
        self._last = now
        return self._spent > self.budget_s

    @property
    def waited_s(self) -> float:
        """Wall seconds since the deadline was set."""
        return time.monotonic() - self.started

    @property
    def left_s(self) -> float:
        """Seconds left: wall seconds for a wall deadline, else unloaded seconds as of the last poll."""
        return self.budget_s - (self.waited_s if self.wall else self._spent)


def wait_until(
    check: Callable[[], T], budget_s: float, what: str, every_s: float = 0.1, *, wall: bool = False
) -> T:
    """Poll ``check`` until it returns something truthy and return that; TimeoutError naming ``what``
    once ``budget_s`` unloaded seconds (wall seconds with ``wall=True``) have passed without it."""
    deadline = Deadline(budget_s, wall=wall)
    while True:
        value = check()
        if value:
            return value
        if deadline.expired():
            bound = (
                f"{budget_s:g} s" if wall else f"{deadline.waited_s:.0f} s (budget {budget_s:g} s at load)"
            )
            raise TimeoutError(f"{what}: not within {bound}")
        time.sleep(every_s)
