"""Logging for croqq entrypoints (library modules only create loggers; entrypoints configure handlers)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)-7s %(process)d %(name)s: %(message)s"


def configure(level: str = "INFO", logfile: Path | None = None) -> None:
    handler: logging.Handler
    if logfile is not None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(logfile)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("kombu", "amqp", "celery.worker.strategy", "celery.app.trace"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
