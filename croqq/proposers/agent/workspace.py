"""The agent's workspace: built fresh per IDEATE step, snapshotted, and read back after the agent ran.

:func:`build` lays out the files of :mod:`croqq.proposers.agent.contract` in a new temp folder;
:func:`snapshot` records every entry (type, size, content hash, symlink target) without following links;
:func:`answer` compares the folder after the agent with the snapshot and returns the candidate's bytes,
or raises :class:`~croqq.proposers.agent.checks.CheckFailed` with a one-line reason: a provided file
changed or removed, a symlink that leads out of the workspace, no candidate, more than one new file, an
over-size candidate (refused before it is read).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from croqq.backends.toolchain import package_includes
from croqq.domain import source as src
from croqq.domain.knobs import compile_flags
from croqq.domain.manifest import Manifest, rule_env
from croqq.domain.records import HistoryEntry
from croqq.domain.source import HeaderResolver, read_header
from croqq.errors import HostError
from croqq.proposers._base import ProposeContext
from croqq.proposers.agent import contract as c
from croqq.proposers.agent.checks import CheckFailed, check_size

log = logging.getLogger(__name__)

HARNESS = "harness.cuh"  # every family's main(): never the kernel a candidate takes over
FAMILY_DEFINE = re.compile(r"^#define (CROQQ_\w+) 1$", re.MULTILINE)
NO_CANDIDATE = "no-candidate"  # the CheckFailed rule of an agent that answered nothing (its own failure)
Entry = tuple[str, int, str]  # kind (file, dir, link), size, content hash or link target


@dataclass(frozen=True)
class Workspace:
    root: Path
    before: dict[str, Entry]

    def remove(self) -> None:
        for path in self.root.rglob("*"):  # the read-only copies must be writable to be removed
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(self.root, ignore_errors=True)


def _digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def snapshot(root: Path) -> dict[str, Entry]:
    """Every entry below ``root`` (scratch space excluded), links not followed."""
    found: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        if rel_dir == c.SCRATCH or rel_dir.startswith(c.SCRATCH + "/"):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = here / name
            rel = path.relative_to(root).as_posix()
            if rel == c.SCRATCH:
                continue
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", 0, "")
            elif stat.S_ISREG(st.st_mode):
                # a candidate may be huge: it is sized, not hashed, until it passes the size check
                digest = _digest(path) if st.st_size <= (1 << 20) else f"size:{st.st_size}"
                found[rel] = ("file", st.st_size, digest)
            else:
                found[rel] = ("other", 0, "")
    return found


def _escapes(root: Path, rel: str, target: str) -> bool:
    resolved = (root / rel).parent.joinpath(target).resolve()
    return not resolved.is_relative_to(root.resolve())


def answer(ws: Workspace, max_bytes: int, agent: str) -> tuple[bytes, str]:
    """(candidate bytes, SUMMARY.txt text) after the agent ran, or CheckFailed."""
    after = snapshot(ws.root)
    for rel, entry in sorted(after.items()):
        if entry[0] == "link" and _escapes(ws.root, rel, entry[2]):
            raise CheckFailed(f"agent {agent} left {rel} as a symlink out of the workspace ({entry[2]})")
    removed = sorted(set(ws.before) - set(after))
    changed = sorted(rel for rel in set(ws.before) & set(after) if ws.before[rel] != after[rel])
    for verb, rels in (("removed", removed), ("modified", changed)):
        if rels:
            only = f"only {c.CANDIDATE} and {c.SUMMARY} may be written"
            raise CheckFailed(f"agent {agent} {verb} {', '.join(rels)[:160]}; {only}")
    new = sorted(set(after) - set(ws.before) - {c.SUMMARY})
    if any(after[rel][0] == "other" for rel in new):
        raise CheckFailed(f"agent {agent} created something that is not a file: {', '.join(new)[:200]}")
    files = [rel for rel in new if after[rel][0] != "dir"]
    if not files:
        raise CheckFailed(
            f"agent {agent} wrote no candidate (expected {c.CANDIDATE} in the workspace)", NO_CANDIDATE
        )
    if files != [c.CANDIDATE]:
        raise CheckFailed(
            f"agent {agent} wrote {len(files)} file(s) ({', '.join(files)[:160]}): "
            f"exactly one candidate, {c.CANDIDATE}, is expected"
        )
    if after[c.CANDIDATE][0] != "file":
        raise CheckFailed(f"agent {agent} wrote {c.CANDIDATE} as a {after[c.CANDIDATE][0]}, not a file")
    check_size(after[c.CANDIDATE][1], max_bytes, c.CANDIDATE)
    data = (ws.root / c.CANDIDATE).read_bytes()
    summary = ""
    summary_path = ws.root / c.SUMMARY
    if after.get(c.SUMMARY, ("", 0, ""))[0] == "file" and after[c.SUMMARY][1] <= 64 * 1024:
        text = summary_path.read_bytes().decode("utf-8", errors="replace")
        summary = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return data, summary[:300]


# -- rendering the provided files ----------------------------------------------------------------


def history_markdown(key: str, entries: list[HistoryEntry]) -> str:
    lines = [
        f"# History of {key}",
        "",
        "Every stored iteration and attempt, oldest first. Attempts (no iteration id) failed to build "
        "or were refused before the build. Rows `NNN cK` are the other candidates of iteration NNN "
        "(SIBLING: measured in the same batch, not chosen; REPEAT: the same kernel as another).",
        "",
        "| iter | decision | TFLOPS | change | proposer | idea | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        where = (
            f"{e.iteration:03d}" if e.iteration is not None else f"attempt {e.attempt} after {e.after_iter}"
        ) + (f" c{e.candidate}" if e.candidate is not None else "")
        error = " ".join(e.error.split()).replace("|", "/")[:200]
        idea = " ".join(e.summary.split()).replace("|", "/")
        lines.append(
            f"| {where} | {e.decision} | {e.tflops:.2f} | {e.change or '-'} | {e.proposer or '-'} "
            f"| {idea} | {error or '-'} |"
        )
    return "\n".join(lines) + "\n"


def ideas_markdown(entries: list[HistoryEntry]) -> str:
    seen = dict.fromkeys(" ".join(e.summary.split()) for e in entries if e.iteration != 0)
    body = [f"- {idea}" for idea in seen] or ["- (none yet)"]
    return "# Ideas already tried on this shape (do not repeat them)\n\n" + "\n".join(body) + "\n"


def build_command(manifest: Manifest, ctx: ProposeContext) -> str:
    """The compile command of a candidate in the workspace: the family's flags, ``include/``, and the
    include folders of its packages (CUTLASS's headers, read-only where they are installed)."""
    spec = manifest.dsl(ctx.dsl).build
    flags = compile_flags(manifest, ctx.dsl, ctx.shape.dtype)
    try:
        flags += package_includes(spec, ctx.dsl)
    except HostError as exc:  # this ideate host lacks the package: the build hosts have it
        log.warning("%s; the workspace's build command leaves its include folders out", exc)
    words = [spec.compiler, *flags, f"-I{c.INCLUDE}", "-o", "gemm", c.CANDIDATE, *spec.libs]
    return " ".join(words)


TASK_TEMPLATE = """\
# Task: write one faster GEMM kernel for {key}

You are tuning a {dtype} GEMM kernel, C[M,N] = A[M,K] * B[N,K]^T, M={m} N={n} K={k}, for {gpu_type}
(dense peak {peak_tflops:.1f} TFLOPS). Baseline {baseline_tflops:.2f} TFLOPS, current best {best_tflops:.2f}
TFLOPS (iteration {best_iter}){vendor}. This candidate would become iteration {iteration}.{siblings}

**Asked for now: {phase}** - {phase_reason}.
Strategy signal: {strategy} ({consecutive_discards} iterations in a row without a win).
Last profile: bottleneck {bottleneck}; metrics in context.json.

Read `best.cu` (the current best), `context.json`, `history.md` and `ideas.md`; the headers you may
include are in `include/` ({header_list}).{next_door} Then write:

1. `candidate.cu`: ONE self-contained candidate source. Start from best.cu. Keep the `#define GEMM_M/N/K`
   lines, and define every knob ({knob_list}) to a value of its space (context.json `knob_space`; a
   combination that breaks one of context.json `rules` is refused before any compile). You may change
   the knob macros, or take the kernel into the file{ownership} and edit it: CTA scheduling or the tile
   scheduler, shared-memory layout and pipeline depth, barriers, `__launch_bounds__`, the epilogue,
   prefetch, inline PTX. {run_rule}
2. `SUMMARY.txt`: one line, your idea in words and why (it goes into the history and the commit message).

Rules (a candidate that breaks one is refused before it is built, and counts against you):
- write nothing else, anywhere; do not modify the provided files;
- include only the headers in include/ (by plain name) and toolchain headers; no absolute paths, no `..`;
- {forbidden};
- not identical to best.cu or to an idea in ideas.md.

Build command (run from this folder, for your information): `{build_command}`
"""


RUN_RULES = {  # by the family's run kind: what the candidate must keep, and what it may not do
    "harness": (
        'It must still `#include "harness.cuh"` (the harness provides main, verification and timing).',
        "no timing or clock reads, no calls into the harness or its reference, no cudaDeviceReset, no "
        "memory of your own (cudaMalloc, malloc, __device__ variables), no main()",
    ),
    "self-timed": (
        "Keep its own main() and timer, and what they print (croqq reads the TFLOPS line; the timing is "
        "recorded as self-reported).",
        "no calls of cuBLAS, of a reference GEMM or of another library's GEMM, no cudaDeviceReset",
    ),
}


def ownership(family: c.FamilyLayout | None) -> str:
    """TASK.md's words on taking the kernel into the candidate's own file."""
    if family is None:
        return ""
    after = " and ".join(f'`#include "{name}"`' for name in family.after)
    return (
        f' (replace `#include "{family.header}"` by `#define {family.define} 1`, the text of '
        f"`{c.INCLUDE}/{family.kernel}` without its `#pragma once`, then {after})"
    )


def family_layout(
    manifest: Manifest, dsl: str, dtype: str, resolver: HeaderResolver
) -> c.FamilyLayout | None:
    """What the dtype's family header defines and includes (None: it includes no kernel header)."""
    header = Path(manifest.dsl(dsl).kernels[dtype].source).name  # what best.cu includes
    found = resolver.resolve(header)
    text = read_header(found) if found is not None else ""
    define = FAMILY_DEFINE.search(text)
    names = [inc.path for inc in src.includes(text) if not inc.angle]
    if define is None or not names or names[0] == HARNESS:
        return None
    return c.FamilyLayout(header=header, define=define.group(1), kernel=names[0], after=names[1:])


def task_prompt(context: c.WorkspaceContext) -> str:
    vendor = f", vendor library {context.vendor_tflops:.2f} TFLOPS" if context.vendor_tflops else ""
    siblings = (
        f"\nYou are candidate {context.candidate} of {context.candidates} for this iteration, written at "
        "the same time as the others: make yours different (another idea, not another variant of the "
        "obvious one). The fastest of them is kept."
        if context.candidates > 1
        else ""
    )
    return TASK_TEMPLATE.format(
        **context.model_dump(),
        vendor=vendor,
        siblings=siblings,
        header_list=", ".join(context.headers),
        knob_list=", ".join(sorted(context.knob_space)),
        ownership=ownership(context.family),
        run_rule=RUN_RULES[context.run][0],
        forbidden=RUN_RULES[context.run][1],
        next_door=_next_door(context.neighbours),
    )


def _next_door(neighbours: list[c.NeighbourEntry]) -> str:
    """TASK.md's line on what won next door ('' when no neighbour has advanced)."""
    if not neighbours:
        return ""
    won = ", ".join(f"{nb.key} {nb.best_tflops:.1f} TFLOPS" for nb in neighbours)
    return (
        f"\nWhat won next door ({won}): their best kernels, re-targeted to this shape, are in "
        f"`{c.NEIGHBOURS}/` and listed in context.json `neighbours`."
    )


def neighbour_path(key: str) -> str:
    """Where a neighbour's re-targeted kernel lies in the workspace."""
    return f"{c.NEIGHBOURS}/{key}.cu"


def build(ctx: ProposeContext, manifest: Manifest, resolver: HeaderResolver) -> Workspace:
    """A fresh workspace for one IDEATE step (the caller removes it)."""
    root = Path(tempfile.mkdtemp(prefix=f"croqq-ws-{ctx.shape.key}-"))
    headers = resolver.names()
    command = build_command(manifest, ctx)
    context = c.WorkspaceContext(
        key=ctx.shape.key,
        dtype=ctx.shape.dtype,
        m=ctx.shape.m,
        n=ctx.shape.n,
        k=ctx.shape.k,
        dsl=ctx.dsl,
        gpu_type=ctx.gpu_type,
        peak_tflops=ctx.peak_tflops,
        iteration=ctx.iteration,
        candidate=ctx.candidate,
        candidates=ctx.candidates,
        baseline_tflops=ctx.baseline_tflops,
        best_tflops=ctx.best_tflops,
        best_iter=ctx.best_iter,
        vendor_tflops=ctx.vendor_tflops,
        strategy=ctx.strategy,
        consecutive_discards=ctx.consecutive_discards,
        phase=ctx.phase,
        phase_reason=ctx.phase_reason,
        bottleneck=ctx.bottleneck,
        profile_metrics=ctx.profile_metrics,
        knob_space=ctx.knob_space,
        rules=manifest.dsl(ctx.dsl).rules,
        rule_env=rule_env((ctx.shape.m, ctx.shape.n, ctx.shape.k), manifest.dtypes[ctx.shape.dtype]),
        run=manifest.dsl(ctx.dsl).run.kind,
        best_knobs=ctx.best_knobs,
        family=family_layout(manifest, ctx.dsl, ctx.shape.dtype, resolver),
        headers=headers,
        build_command=command,
        neighbours=[
            c.NeighbourEntry(
                **nb.model_dump(exclude={"source"}), source=neighbour_path(nb.key) if nb.source else ""
            )
            for nb in ctx.neighbours
        ],
    )
    files = {
        c.TASK: task_prompt(context),
        c.BEST: ctx.best_source,
        c.CONTEXT: context.model_dump_json(indent=2) + "\n",
        c.HISTORY: history_markdown(ctx.shape.key, ctx.history),
        c.IDEAS: ideas_markdown(ctx.history),
        c.BUILD: f"# Build\n\n```\n{command}\n```\n\nThe harness flags and the run are croqq's.\n",
    }
    files |= {neighbour_path(nb.key): nb.source for nb in ctx.neighbours if nb.source}
    if any(nb.source for nb in ctx.neighbours):
        (root / c.NEIGHBOURS).mkdir()
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    include = root / c.INCLUDE
    for name in headers:
        found = resolver.resolve(name)
        if found is not None:
            target = include / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(read_header(found), encoding="utf-8")
    (root / c.SCRATCH).mkdir()
    for rel in [*files, *(f"{c.INCLUDE}/{n}" for n in headers)]:
        (root / rel).chmod(0o444)
    for folder in [include, *include.rglob("*"), root / c.NEIGHBOURS]:
        if folder.is_dir():
            folder.chmod(0o555)
    return Workspace(root=root, before=snapshot(root))
