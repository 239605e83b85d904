"""Full disks: a cheap free-space check before writing, and ENOSPC turned into :class:`DiskFullError`.

The writer (results repo) and a build host (its build folder) call :func:`require` before each commit or
compile, so most full disks are met before anything is written; a write that runs out of space anyway
goes through :func:`guard`, which raises the same error (the caller has already made sure that nothing
half-written is left). Either way the step waits and retries (``croqq.work.steps``), the shape is never
blamed, and an alarm says what is full.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from croqq.errors import DiskFullError

log = logging.getLogger(__name__)

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# what libgit2, git and compilers print when a write runs out of space (libgit2 raises without an errno)
FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), "Out of diskspace")


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged process may still write on the file system of ``path`` (or of its nearest
    existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def full_error(path: Path, what: str, retry_s: float, reserve: int = 0, detail: str = "") -> DiskFullError:
    """The one-line error (and alarm text) for a full disk under ``path``; ``detail`` (what failed) is
    logged, the line stays one line (``croqq status`` shows it whole)."""
    free = f"{_size(free_bytes(path))} free" + (f", under the {_size(reserve)} reserve" if reserve else "")
    if detail:
        log.info("%s: %s", path, detail)
    return DiskFullError(
        f"no space left on device writing {what} {path} ({free}): free space there; "
        f"croqq retries every {retry_s:g}s",
        path=str(path),
        wait_s=retry_s,
    )


def require(path: Path, reserve: int, what: str, retry_s: float) -> None:
    """Raise DiskFullError unless at least ``reserve`` bytes are free where ``path`` lives."""
    if reserve > 0 and free_bytes(path) < reserve:
        raise full_error(path, what, retry_s, reserve=reserve)


def is_full(exc: BaseException) -> bool:
    """True for an error that says a disk is full (an errno, or libgit2's or a tool's words)."""
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return True
    return says_full(str(exc))


def says_full(text: str) -> bool:
    return any(words in text for words in FULL_TEXTS)


@contextlib.contextmanager
def guard(path: Path, what: str, retry_s: float) -> Iterator[None]:
    """Turn an exception that says the disk is full into DiskFullError (others pass unchanged)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        if is_full(exc):
            raise full_error(path, what, retry_s, detail=str(exc)) from exc
        raise
