"""Proposers: where ideas come from (a search strategy, or a coding agent that writes sources)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from croqq.domain.manifest import Manifest
    from croqq.proposers._base import Proposer
    from croqq.settings import Settings


def make_proposer(settings: Settings, manifest: Manifest) -> Proposer:
    if settings.proposer == "agent":
        from croqq.proposers.agent.proposer import AgentProposer

        return AgentProposer(manifest, settings)
    if settings.proposer == "search":
        from croqq.proposers.search import SearchProposer

        return SearchProposer(manifest, settings)
    from croqq.proposers.model import ModelProposer

    return ModelProposer(manifest, settings)
