"""Shared CLI helpers: settings with one-line errors, logging, the local Runtime."""

from __future__ import annotations

from pydantic import ValidationError

from croqq.errors import ConfigError
from croqq.settings import Settings, get_settings


def load_settings() -> Settings:
    """The settings from CROQQ_* variables; a bad value becomes one ConfigError line naming the variable."""
    try:
        return get_settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "CROQQ_" + str(err["loc"][0]).upper() if err["loc"] else "CROQQ_*"
        raise ConfigError(f"{name}: {err['msg']}") from exc
