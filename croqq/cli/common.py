"""Shared CLI helpers: settings with one-line errors, logging, the local Runtime."""

from __future__ import annotations

from pydantic import ValidationError

from croqq.domain.fsm import MAX_CANDIDATES
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


CANDIDATES_HELP = f"Candidates per iteration, 1..{MAX_CANDIDATES} (default CROQQ_CANDIDATES)."


def candidates_or_default(candidates: int | None, settings: Settings) -> int:
    """``--candidates``, else the setting; one outside 1..MAX_CANDIDATES is one ConfigError line."""
    if candidates is None:
        return settings.candidates
    if not 1 <= candidates <= MAX_CANDIDATES:
        raise ConfigError(
            f"--candidates {candidates}: an iteration gathers 1 to {MAX_CANDIDATES} candidates "
            f"(the documented maximum); use --candidates 1..{MAX_CANDIDATES}"
        )
    return candidates
