"""The ``agent`` proposer: a coding agent rewrites the kernel source in a jailed workspace.

One IDEATE step: build the workspace (:mod:`.workspace`), run the preset's command jailed (:mod:`.jail`),
judge the run (:meth:`Preset.parse`), read the answer back (exactly ``candidate.cu`` + ``SUMMARY.txt``,
nothing else changed), check the candidate (:mod:`.checks`: size, encoding, includes, anti-cheat rules),
then refuse repeats (normalized source equal to the best, or a content hash already tried). The outcome
is an :class:`Idea` or a :class:`Rejection` with a one-line reason that names the agent (``agent`` when
the agent itself failed, ``check`` when its answer broke a rule, ``repeat``): a rejection is stored as
an attempt (no iteration id) and the shape goes on. Agent wall time, turns, tokens and cost travel with
either. The workspace is always removed.
"""

from __future__ import annotations

import logging
import shutil

from croqq.backends.toolchain import toolchain_id
from croqq.domain import source as src
from croqq.domain.knobs import include_resolver, source_candidate
from croqq.domain.manifest import Manifest
from croqq.domain.records import AgentUsage, Change, Idea, Rejection, RejectionKind
from croqq.errors import ConfigError
from croqq.proposers._base import ProposeContext, Proposer, slug
from croqq.proposers.agent import contract, jail, workspace
from croqq.proposers.agent.checks import CheckFailed, check_bytes, check_source
from croqq.proposers.agent.presets import AgentReport, AgentRun, preset_for
from croqq.settings import Settings

log = logging.getLogger(__name__)


class AgentProposer(Proposer):
    is_agent = True

    def __init__(self, manifest: Manifest, settings: Settings) -> None:
        first, *others = settings.agents  # CROQQ_AGENT=claude,codex: one proposer per agent
        super().__init__(manifest, settings.model_copy(update={"agent": first}))
        self.preset = preset_for(self.settings)
        self.name = self.preset.name
        self._mode: str | None = None
        self.others = [AgentProposer(manifest, settings.model_copy(update={"agent": n})) for n in others]

    def for_candidate(self, candidate: int) -> Proposer:
        """The agents of CROQQ_AGENT take an iteration's candidates in turn (1: the first, 2: the second)."""
        pool = [self, *self.others]
        return pool[(candidate - 1) % len(pool)]

    def check_ready(self) -> None:
        for other in self.others:
            other.check_ready()
        exe = self.preset.executable
        if shutil.which(exe) is None:
            raise ConfigError(
                f"agent {self.name}: executable {exe!r} not found on PATH; install it or choose another "
                "CROQQ_AGENT (this worker takes no IDEATE work)"
            )
        self._mode = jail.announce(self.settings)

    @property
    def mode(self) -> str:
        if self._mode is None:
            self._mode = jail.jail_mode(self.settings)
        return self._mode

    def propose(self, ctx: ProposeContext) -> Idea | Rejection:
        resolver = include_resolver(self.manifest, ctx.dsl, self.settings.kernels_dir)
        ws = workspace.build(ctx, self.manifest, resolver)
        try:
            prompt = (ws.root / contract.TASK).read_text(encoding="utf-8")
            argv = self.preset.command(prompt, ws.root, self.settings.agent_model, ws.root / contract.TASK)
            run = jail.run(argv, self.preset, ws.root, self.settings, self.mode)
            return self.judge(ctx, ws, run, resolver)
        finally:
            ws.remove()

    def judge(
        self, ctx: ProposeContext, ws: workspace.Workspace, run: AgentRun, resolver: src.HeaderResolver
    ) -> Idea | Rejection:
        """Everything croqq does after the agent ran: its verdict, the workspace, the checks."""
        report = self.preset.parse(run)
        usage = _usage(self.name, run.wall_s, run.exit_code, report)
        if not report.ok:
            return self._reject(report.error, "agent", usage)
        try:
            data, summary = workspace.answer(ws, self.settings.agent_max_source_bytes, self.name)
            text = check_bytes(data, self.settings.agent_max_source_bytes, contract.CANDIDATE)
        except CheckFailed as exc:
            kind: RejectionKind = "agent" if exc.rule == workspace.NO_CANDIDATE else "check"
            return self._reject(str(exc), kind, usage)
        return self._idea(ctx, text, summary or report.summary, usage, resolver)

    def _reject(
        self,
        reason: str,
        kind: RejectionKind,
        usage: AgentUsage | None,
        summary: str = "",
        content_hash: str = "",
    ) -> Rejection:
        line = " ".join(reason.split())
        if line.startswith(f"{self.name} "):  # the preset's own words: "claude exited 1 ..."
            line = f"agent {line}"
        elif not line.startswith(f"agent {self.name}"):
            line = f"agent {self.name}: {line}"
        return Rejection(
            proposer=self.name,
            reason=line[:500],
            kind=kind,
            agent=usage,
            summary=summary[:300],
            content_hash=content_hash,
        )

    def _idea(
        self,
        ctx: ProposeContext,
        text: str,
        summary: str,
        usage: AgentUsage,
        resolver: src.HeaderResolver,
    ) -> Idea | Rejection:
        self_timed = self.manifest.dsl(ctx.dsl).run.kind == "self-timed"
        findings = check_source(text, resolver, contract.CANDIDATE, self_timed)
        if findings:
            more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
            return self._reject(f"{findings[0].message}{more}", "check", usage, summary)
        source = text.replace(f'"{contract.INCLUDE}/', '"')  # include/x.cuh is the workspace copy of x.cuh
        try:
            headers = src.header_closure(source, src.read_from(resolver))
        except src.SourceError as exc:
            return self._reject(str(exc), "check", usage, summary)
        tool = toolchain_id(self.settings, self.manifest, ctx.dsl)
        cand = source_candidate(self.manifest, ctx.dsl, ctx.shape.dtype, source, headers, tool)
        if src.normalize(source) == src.normalize(ctx.best_source):
            return self._reject("returned the best source unchanged", "repeat", usage, summary)
        if cand.content_hash in ctx.tried:
            return self._reject(
                f"repeats an earlier candidate ({cand.short_hash})",
                "repeat",
                usage,
                summary,
                cand.content_hash,
            )
        if not summary:
            return self._reject(f"no idea in words: write it into {contract.SUMMARY}", "check", usage)
        knobs = list(ctx.knob_space)
        change: Change = (
            "knobs" if src.structure(source, knobs) == src.structure(ctx.best_source, knobs) else "structural"
        )
        log.info(
            "agent %s proposed for %s iter %d in %.1f s: %s",
            self.name,
            ctx.shape.key,
            ctx.iteration,
            usage.wall_s,
            summary,
        )
        return Idea(
            summary=summary[:300],
            tag=slug(summary),
            knobs=cand.knobs,
            content_hash=cand.content_hash,
            strategy=ctx.strategy,
            proposer=self.name,
            source=source,
            change=change,
            phase=ctx.phase,
            agent=usage,
        )


def _usage(agent: str, wall_s: float, exit_code: int | None, report: AgentReport) -> AgentUsage:
    return AgentUsage(
        agent=agent,
        wall_s=wall_s,
        exit_code=exit_code,
        turns=report.turns,
        input_tokens=report.input_tokens,
        output_tokens=report.output_tokens,
        cost_usd=report.cost_usd,
    )
