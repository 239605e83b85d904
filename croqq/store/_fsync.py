"""The one fsync helper of the results store (see "What survives a power loss" in tuning/README.md)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path | str) -> None:
    """Flush a file's data, or a folder's names (after a rename or create in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
