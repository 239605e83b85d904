"""What a command promises to print, found among whatever else it printed (a warning, a progress line)."""

from __future__ import annotations


def error_line(stderr: str) -> str:
    """The one ``croqq: error: ...`` line a refused command prints (exactly one, and no traceback)."""
    errors = [line for line in stderr.splitlines() if line.startswith("croqq: error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]
