"""croqq's scripted reference agent: a deterministic stand-in for a coding agent (``make demo``, tests).

Run as ``python -I scripted.py`` with cwd = an agent workspace (:mod:`croqq.proposers.agent.contract`):
it reads context.json, best.cu, ideas.md and include/, and writes exactly candidate.cu and SUMMARY.txt.
Standard library only (it runs jailed, with an isolated interpreter), so the few file names it needs are
declared again below.

It edits best.cu the way a careful engineer would, seeded by sha256(key, iteration, best.cu, ideas.md, and
the attempts since the last iteration in history.md): the same workspace gives the same answer, and an
answer that was refused or did not build is not given again.

- phase ``knobs``: one or two knob ``#define`` values moved to a neighbouring value of the knob space,
  leaning towards the moves the profile's bottleneck suggests and staying inside the shared-memory and
  register envelope and the family's rules (context.json's ``rules`` over ``rule_env``); nothing else
  changes.
- phases ``structural``, ``micro``, ``regenerate``: first *take ownership* of the kernel (the family
  include becomes the family's define, the text of the kernel header it includes first, gemm_core.cuh
  or cutlass_sm90.cuh, and its other includes), then one structural edit not listed in ideas.md: an
  unroll factor, the __launch_bounds__ minimum of resident CTAs, the CTA raster order, the
  cp.async wait depth (cuda); the epilogue without its C source, the shared memory the automatic stage
  count leaves out (cutlass); the profile's bottleneck favours some kinds (``micro`` more strongly).
  ``regenerate`` may add a three-knob jump; once every edit on offer is in ideas.md (the cutlass family
  offers two), a knob move instead, so that it is not the same candidate (or compile error) again. About 8%
  of the edits come out broken (a typo'd identifier, a missing semicolon: :data:`BROKEN`) and really fail
  nvcc.

Tests only: ``CROQQ_SCRIPTED_MISBEHAVE=<name>`` does the wrong thing :data:`MISBEHAVIOURS` names instead
(``CROQQ_SCRIPTED_TARGET``: where ``symlink`` points).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
import time

TYPE_CHECKING = False  # typing, dataclasses, pathlib and ast: ~17 ms of CPU per start, not imported
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

BEST, CONTEXT, IDEAS, INCLUDE = "best.cu", "context.json", "ideas.md", "include"  # as in contract.py
HISTORY = "history.md"
CANDIDATE, SUMMARY = "candidate.cu", "SUMMARY.txt"
HARNESS = "harness.cuh"
BROKEN_RATE = 0.08
JUMP_RATE = 0.5  # regenerate: the share of edits that also jump three knobs
SMEM_BYTES, MAX_ACC_REGS, MIN_WARP_N = 227 * 1024, 256, 32

GUIDANCE: dict[str, dict[str, int]] = {  # bottleneck -> knob -> the helpful direction (0: either way)
    "memory": {"TILE_M": 1, "TILE_N": 1, "SWIZZLE": 1, "RASTER": 0, "STAGES": 1},
    "latency": {"STAGES": 1, "SPLIT_K": 1, "TILE_K": 0, "WARPS_M": 1, "WARPS_N": 1},
    "compute": {"WARPS_M": 0, "WARPS_N": 0, "EPI_VEC": 1, "TILE_K": 1},
    "launch": {"SPLIT_K": -1, "TILE_M": -1, "TILE_N": -1, "STAGES": -1},
}
WHY = {
    "memory": "for more operand reuse and L2 hits",
    "latency": "to hide more memory latency",
    "compute": "to keep the tensor cores fed",
    "launch": "to cut fixed overhead",
}
AFFINITY = {"memory": "raster", "latency": "pipeline", "compute": "unroll", "launch": "bounds"}
BROKEN = (  # (correct text, the slip): the first occurrence is replaced
    ("cp_async_wait<", "cp_async_wiat<"),
    ("const int next = it + STAGES - 1;\n", "const int next = it + STAGES - 1\n"),
    ("tile_coords(blockIdx.x, tile_m, tile_n);", "tile_coord(blockIdx.x, tile_m, tile_n);"),
    ("GemmUniversalAdapter<Kernel>;", "GemmUniversalAdapter<Kernel>"),  # cutlass
)
SWAPS = (  # (kind, text, replacement, the idea in words): edits of one spelled-out site
    (
        "bounds",
        "__launch_bounds__(kThreads)",
        "__launch_bounds__(kThreads, 2)",
        "ask for two resident CTAs per SM with __launch_bounds__(kThreads, 2) to lift occupancy",
    ),
    (
        "bounds",
        "__launch_bounds__(kThreads)",
        "__launch_bounds__(kThreads, 1)",
        "declare one CTA per SM with __launch_bounds__(kThreads, 1) so ptxas may keep more registers",
    ),
    (
        "pipeline",
        "cp_async_wait<STAGES - 2>()",
        "cp_async_wait<STAGES - 3>()",
        "drain the cp.async pipeline one group deeper (wait_group STAGES - 3) before each k-tile",
    ),
    (
        "pipeline",
        "cp_async_wait<STAGES - 2>()",
        "cp_async_wait<STAGES - 1>()",
        "keep one more cp.async group in flight (wait_group STAGES - 1) to overlap loads with MMAs",
    ),
    (
        "raster",
        "const int minor = in_group / size;",
        "const int minor = (group & 1) ? kMinor - 1 - in_group / size : in_group / size;",
        "walk alternate raster groups backwards (serpentine) so neighbouring groups share panels",
    ),
    (  # the cutlass family (cutlass_sm90.cuh)
        "epilogue",
        "EpilogueTileAuto, float, float, Out, LayoutC,",
        "EpilogueTileAuto, float, float, void, LayoutC,",
        "drop the epilogue's C source (beta is 0, C is never read): no C loads, and the shared memory "
        "it staged goes to the mainloop's stages",
    ),
    (
        "pipeline",
        "StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>",
        "StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage)) + 32 * 1024>",
        "keep 32 KiB of shared memory out of the automatic stage count (one mainloop stage fewer, "
        "more L1 for the epilogue)",
    ),
)
RASTER_GROUPS = (  # tile_coords' group size (SWIZZLE) -> another expression, and the idea in words
    ("(2 * SWIZZLE)", "raster the CTAs in groups of 2*SWIZZLE tiles to widen the L2 reuse window"),
    ("(SWIZZLE > 1 ? SWIZZLE / 2 : 1)", "raster the CTAs in groups of SWIZZLE/2 tiles to even out L2 use"),
    ("(kMajor < 8 ? kMajor : 8)", "raster the CTAs in fixed groups of 8 tiles whatever SWIZZLE says"),
)
UNROLL = re.compile(r"#pragma unroll( \d+)?[ \t]*\n[ \t]*for \(int (\w+) = [^;]*; \2 < ([^;]+);")
TILE_COORDS = re.compile(r"void tile_coords\(.*?\n\}", re.DOTALL)
INCLUDE_LINE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[^\n]*$', re.MULTILINE)
FAMILY_DEFINE = re.compile(r"^#define (CROQQ_\w+) 1$", re.MULTILINE)
PRAGMA_ONCE = re.compile(r"^#pragma once[ \t]*\n", re.MULTILINE)  # in a .cu file nvcc warns of it


def define_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"^([ \t]*#[ \t]*define[ \t]+{name}[ \t]+)\(?(-?\d+)\)?", re.MULTILINE)


def attempts_since_iteration(history: str) -> int:
    """The attempt rows at the end of history.md (after its last iteration's)."""
    rows = [line for line in history.splitlines() if line.startswith("| ") and not line.startswith("| iter ")]
    count = 0
    for row in reversed(rows):
        if not row.startswith("| attempt "):
            break
        count += 1
    return count


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class Workspace:
    def __init__(self, ctx: dict[str, Any], best: str, ideas: str, seed: int) -> None:
        self.ctx, self.best, self.ideas, self.seed = ctx, best, ideas, seed

    @classmethod
    def read(cls) -> Workspace:
        ctx = json.loads(read(CONTEXT))
        best = read(BEST)
        ideas = read(IDEAS) if os.path.isfile(IDEAS) else ""
        parts = [str(ctx["key"]), str(ctx["iteration"]), best, ideas]
        retries = attempts_since_iteration(read(HISTORY)) if os.path.isfile(HISTORY) else 0
        if retries:  # the last answers were refused or did not build: another draw, not the same again
            parts.append(f"retry {retries}")
        digest = hashlib.sha256("\0".join(parts).encode())
        return cls(ctx, best, ideas, int.from_bytes(digest.digest()[:8], "big"))

    def get(self, name: str, default: Any = None) -> Any:
        return self.ctx.get(name, default)

    @property
    def space(self) -> dict[str, list[int]]:
        return dict(self.ctx["knob_space"])

    @property
    def knobs(self) -> dict[str, int]:
        """The best kernel's knob values (its #defines; context.json's best_knobs where it has none)."""
        return {**(self.get("best_knobs") or {}), **knob_values(self.best, self.space)}

    @property
    def bottleneck(self) -> str:
        return str(self.get("bottleneck", "unknown"))

    def because(self) -> str:
        return f" ({self.bottleneck}-bound per profile)" if self.bottleneck in GUIDANCE else ""


class Edit:
    def __init__(self, kind: str, summary: str, apply: Callable[[str], str]) -> None:
        self.kind = kind  # unroll / bounds / raster / pipeline / epilogue
        self.summary = summary
        self.apply = apply


# -- knobs -------------------------------------------------------------------------------------------


def knob_values(text: str, space: dict[str, list[int]]) -> dict[str, int]:
    found = {name: define_re(name).findall(text) for name in space}
    return {name: int(hits[-1][1]) for name, hits in found.items() if hits}


def set_knobs(text: str, moves: dict[str, int]) -> str:
    for name, value in moves.items():
        text = define_re(name).sub(rf"\g<1>{value}", text)
    return text


def fits(knobs: dict[str, int], dtype: str, k: int) -> bool:
    """The engineer's envelope check (shared memory, accumulator registers, MMA width, split-K slice)."""
    try:
        a_bytes = 1 if dtype == "e4m3" else 2
        smem = (knobs["TILE_M"] + knobs["TILE_N"]) * knobs["TILE_K"] * a_bytes * knobs["STAGES"]
        acc = knobs["TILE_M"] * knobs["TILE_N"] // (knobs["WARPS_M"] * knobs["WARPS_N"] * 32)
        return (
            smem <= SMEM_BYTES
            and acc <= MAX_ACC_REGS
            and knobs["TILE_N"] // knobs["WARPS_N"] >= MIN_WARP_N
            and k % (knobs["SPLIT_K"] * knobs["TILE_K"]) == 0
        )
    except KeyError:
        return True


RULE_FUNCTIONS = {"min": min, "max": max}
_CODE: dict[str, Any] = {}


def compiled(require: str) -> Any:
    """A rule's code (compiled once: knob_moves checks many draws), or None if it does not compile or holds
    nested code (a lambda, a comprehension)."""
    if require not in _CODE:
        try:
            code = compile(require, "rule", "eval")
        except SyntaxError:
            code = None
        _CODE[require] = None if code is None or any(hasattr(c, "co_code") for c in code.co_consts) else code
    return _CODE[require]


def rules_hold(ws: Workspace, knobs: dict[str, int]) -> bool:
    """No rule of context.json is broken by these knobs on this shape (croqq refuses those unbuilt).

    croqq accepts only plain-arithmetic rules (:mod:`croqq.domain.rules`); this agent evaluates one only
    when its compiled code names nothing but the context's values and min/max (no attribute, no other
    function) and holds no nested code (no lambda or comprehension); anything else it leaves to croqq."""
    env = {**ws.get("rule_env", {}), **knobs}
    for rule in ws.get("rules", []):
        code = compiled(rule["require"])
        if code is None or not set(code.co_names) <= env.keys() | RULE_FUNCTIONS.keys():
            continue  # not plain arithmetic: croqq judges it
        try:
            if not eval(code, {"__builtins__": {}, **RULE_FUNCTIONS}, env):
                return False
        except (NameError, TypeError, ZeroDivisionError):
            continue  # a name this context lacks: croqq judges it
    return True


DRAWS = 40  # draws of one size and reach before knob_moves widens the neighbourhood


def knob_moves(ws: Workspace, rng: random.Random, count: int, reach: int = 1) -> dict[str, int]:
    """``count`` knobs moved up to ``reach`` steps, leaning the bottleneck's way, inside the envelope and
    the family's rules, and not an idea of ideas.md. When :data:`DRAWS` draws find none (the near moves were
    all tried: a tight family such as cutlass has about ten single moves), one more knob, then one more
    step, before anything tried or refused is given again."""
    fallback: dict[str, int] = {}
    for more, wider in ((0, 0), (1, 0), (1, 1), (2, 1)):
        moves, first = _draw(ws, rng, count + more, reach + wider)
        if moves:
            return moves
        fallback = fallback or first
    return fallback


def _draw(ws: Workspace, rng: random.Random, count: int, reach: int) -> tuple[dict[str, int], dict[str, int]]:
    """(a valid, untried move of ``count`` knobs up to ``reach`` steps, or {}; the first move drawn)."""
    space, now = ws.space, ws.knobs
    helpful = GUIDANCE.get(ws.bottleneck, {})
    options: list[tuple[str, int]] = []
    weights: list[float] = []
    for name, values in space.items():
        if now.get(name) not in values:
            continue
        at = values.index(now[name])
        for step in (s for s in range(-reach, reach + 1) if s and 0 <= at + s < len(values)):
            options.append((name, values[at + step]))
            good = name in helpful and (helpful[name] == 0 or (helpful[name] > 0) == (step > 0))
            weights.append((3.0 if good else 1.0) / abs(step))
    wanted = min(count, len({name for name, _ in options}))
    first: dict[str, int] = {}
    for _ in range(DRAWS):
        moves: dict[str, int] = {}
        while len(moves) < wanted:
            name, value = rng.choices(options, weights)[0]
            moves.setdefault(name, value)
        knobs = {**now, **moves}
        if (
            fits(knobs, str(ws.get("dtype")), int(ws.get("k", 0)))
            and rules_hold(ws, knobs)
            and describe(now, moves) not in ws.ideas
        ):
            return moves, first
        first = first or moves
    return {}, first


def describe(now: dict[str, int], moves: dict[str, int]) -> str:
    return " and ".join(f"{name} {now.get(name)} -> {value}" for name, value in sorted(moves.items()))


def knob_idea(ws: Workspace, rng: random.Random) -> tuple[str, str]:
    moves = knob_moves(ws, rng, 1 if rng.random() < 0.6 else 2)
    why = WHY.get(ws.bottleneck, "to explore the neighbourhood of the best")
    return set_knobs(ws.best, moves), f"set {describe(ws.knobs, moves)} {why}{ws.because()}"


# -- structural edits --------------------------------------------------------------------------------


def take_ownership(text: str, include: str) -> tuple[str, str] | None:
    """(the source with its family include replaced by the family's define, the text of the kernel
    header the family includes first and the family's other includes, that kernel header's name), or
    None when the source already owns its kernel: cuda's gemm_f16.cuh is CROQQ_F16, gemm_core.cuh and
    harness.cuh; cutlass's cutlass_f16.cuh is CROQQ_F16, cutlass_sm90.cuh, cutlass_run.cuh, harness.cuh."""
    for m in INCLUDE_LINE.finditer(text):
        header = os.path.join(include, m.group(1))
        body = read(header) if os.path.isfile(header) else ""
        define = FAMILY_DEFINE.search(body)
        kernels = INCLUDE_LINE.findall(body)
        if define and kernels and kernels[0] != HARNESS:
            core = re.sub(PRAGMA_ONCE, "", read(os.path.join(include, kernels[0])))
            rest = "".join(f'\n#include "{name}"' for name in kernels[1:])
            owned = f"#define {define.group(1)} 1\n{core.rstrip()}{rest}"
            return text[: m.start()] + owned + text[m.end() :], kernels[0]
    return None


def splice(start: int, end: int, new: str) -> Callable[[str], str]:
    return lambda text: text[:start] + new + text[end:]


def swap(old: str, new: str) -> Callable[[str], str]:
    return lambda text: text.replace(old, new, 1)


def structural_edits(text: str) -> list[Edit]:
    """Every structural edit this source offers."""
    edits: list[Edit] = []
    for n, m in enumerate(UNROLL.finditer(text), start=1):
        if m.group(1) is None:
            loop = f"the {m.group(2)} < {m.group(3).strip()} loop (unrolled loop #{n})"
            at = m.start() + len("#pragma unroll")
            edits += [
                Edit(
                    "unroll",
                    f"do not unroll {loop} to cut code size and register pressure",
                    splice(at, at, " 1"),
                ),
                Edit("unroll", f"unroll {loop} only twice to cut register pressure", splice(at, at, " 2")),
            ]
    edits += [Edit(kind, words, swap(old, new)) for kind, old, new, words in SWAPS if old in text]
    coords = TILE_COORDS.search(text)
    if coords and re.search(r"\bSWIZZLE\b", coords.group(0)):
        edits += [
            Edit("raster", words, splice(*coords.span(), re.sub(r"\bSWIZZLE\b", expr, coords.group(0))))
            for expr, words in RASTER_GROUPS
        ]
    return edits


def structural_idea(ws: Workspace, rng: random.Random) -> tuple[str, str]:
    owned = take_ownership(ws.best, INCLUDE)
    text = ws.best if owned is None else owned[0]
    fresh = [e for e in structural_edits(text) if e.summary not in ws.ideas]
    if not fresh:  # every edit on offer was tried: another one would repeat it (or its compile error)
        return knob_idea(ws, rng)
    favour = 6.0 if ws.get("phase") == "micro" else 3.0
    kinds = sorted({e.kind for e in fresh})  # a kind first: the many unroll sites are one idea
    kind = rng.choices(kinds, [favour if AFFINITY.get(ws.bottleneck) == k else 1.0 for k in kinds])[0]
    edit = rng.choice([e for e in fresh if e.kind == kind])
    text, summary = edit.apply(text), edit.summary
    if ws.get("phase") == "regenerate" and rng.random() < JUMP_RATE:
        moves = knob_moves(ws, rng, 3, reach=2)
        text, summary = set_knobs(text, moves), f"{summary}, and jump {describe(ws.knobs, moves)}"
    if rng.random() < BROKEN_RATE:
        slips = [(old, new) for old, new in BROKEN if old in text]
        if slips:
            text = swap(*rng.choice(slips))(text)
    if owned is not None:
        summary = f"take ownership of the kernel ({owned[1]} inlined), then {summary}"
    return text, summary + ws.because()


def propose(ws: Workspace) -> tuple[str, str]:
    rng = random.Random(ws.seed)
    return (knob_idea if ws.get("phase", "knobs") == "knobs" else structural_idea)(ws, rng)


# -- answers and misbehaviours -----------------------------------------------------------------------


def answer(text: str, summary: str) -> None:
    write(CANDIDATE, text)
    write(SUMMARY, summary.replace("\n", " ")[:300] + "\n")


def die(code: int, message: str) -> NoReturn:
    print(f"scripted agent: {message}", file=sys.stderr)
    raise SystemExit(code)


def forever() -> None:
    while True:
        time.sleep(3600)


def through_symlink(ws: Workspace) -> None:
    target = os.environ.get("CROQQ_SCRIPTED_TARGET") or die(2, "symlink needs CROQQ_SCRIPTED_TARGET")
    os.symlink(target, CANDIDATE)
    answer(ws.best, "write through a symlink")


def normal_then(after: Callable[[str], object]) -> Callable[[Workspace], None]:
    def act(ws: Workspace) -> None:
        text, summary = propose(ws)
        answer(text, summary)
        after(text)

    return act


HUGE_LINE, HUGE_LINES = "//" + "x" * 1021 + "\n", 50 * 1024  # 50 MiB of comment lines
TIMING = (
    "\nstatic float croqq_own_timing_ms(cudaStream_t s) {\n  cudaEvent_t a, b;\n  cudaEventCreate(&a);\n"
    "  cudaEventCreate(&b);\n  cudaEventRecord(a, s);\n  cudaEventRecord(b, s);\n  cudaEventSynchronize(b);\n"
    "  float ms = 0.f;\n  cudaEventElapsedTime(&ms, a, b);\n  return ms;\n}\n"
)
MISBEHAVIOURS: dict[str, Callable[[Workspace], object]] = {
    "nothing": lambda ws: None,
    "two": normal_then(lambda text: write("candidate2.cu", text)),
    "huge": lambda ws: answer(ws.best + HUGE_LINE * HUGE_LINES, "a 50 MB candidate"),
    "symlink": through_symlink,
    "include-passwd": lambda ws: answer('#include "/etc/passwd"\n' + ws.best, "include /etc/passwd"),
    "include-escape": lambda ws: answer('#include "../../croqq/settings.py"\n' + ws.best, "include croqq"),
    "loop": lambda ws: forever(),
    "garbage": lambda ws: sys.stdout.buffer.write(random.Random(ws.seed).randbytes(1 << 20)),
    "fail": lambda ws: die(3, "told to fail (CROQQ_SCRIPTED_MISBEHAVE=fail)"),
    "unchanged": lambda ws: answer(ws.best, "no change"),
    "timing": lambda ws: answer(ws.best + TIMING, "time the kernel with CUDA events myself"),
    "modify": normal_then(lambda text: write(BEST, text)),
}


def main() -> int:
    ws = Workspace.read()
    mode = os.environ.get("CROQQ_SCRIPTED_MISBEHAVE", "")
    if mode:
        act = MISBEHAVIOURS.get(mode)
        if act is None:
            die(2, f"unknown CROQQ_SCRIPTED_MISBEHAVE={mode!r} (one of {', '.join(MISBEHAVIOURS)})")
        act(ws)
        return 0
    text, summary = propose(ws)
    answer(text, summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
