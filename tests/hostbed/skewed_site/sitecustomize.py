"""Imported by every Python process of a skewed host of the bed (``PYTHONPATH``; see
:mod:`tests.hostbed.bed`): libfaketime fakes the wall clock there but leaves the monotonic clock real, and
then refuses ``clock_nanosleep(TIMER_ABSTIME)``, which ``time.sleep`` uses. This ``time.sleep`` waits in
``select`` instead (on the same real monotonic clock)."""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep  # type: ignore[assignment]
