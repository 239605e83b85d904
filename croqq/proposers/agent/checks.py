"""Static checks on an agent's candidate source, run BEFORE anything is built.

A candidate (``candidate.cu``, see :mod:`croqq.proposers.agent.contract`) may tune or rewrite the kernel
but not the measurement. Each finding is one line saying what to fix; the rules:

- ``absolute-include``, ``escaping-include``, ``unknown-include``: only the manifest's headers by plain
  name (``include/<name>`` means ``<name>``) and toolchain headers in angle brackets; nothing croqq cannot
  resolve (``#include MACRO``, ``#include_next``, ``#import``).
- ``host-timing``: no clock read or timing of any kind, host or device, inline PTX included.
- ``harness-call``, ``main``: nothing of the timing harness, no ``main`` (harness.cuh provides it).
- ``reference-read``: not the verification reference or the vendor library it verifies against, nor a
  GEMM that is not the candidate's own (CUTLASS's reference GEMMs, ``cutlass/util/reference/``, and its
  library of prebuilt kernels, ``cutlass::library``).
- ``device-reset``: no device or context control.
- ``foreign-memory``: no allocations, copies, managed or writable global variables, or integer-to-pointer
  casts: it writes only through the pointers the harness passes. ``cudaMemset*`` on the launch's
  ``workspace``/``c`` operands is allowed, because the reference kernel's split-K path zeroes its
  workspace that way.

The rules see the source with comments removed and string literals emptied (except the inline-PTX and
include rules, which need them); line numbers are those of the raw text. Only the candidate's own text is
checked: the headers it includes are croqq's. :func:`check_size` and :func:`check_bytes` (rules ``size``
and ``encoding``) run first, so an over-size source is refused before it is read.

This is a static approximation, easy to dodge with enough macro work; the harness is the run-time
defence: verification on fresh seeds, output poisoned before every run, inputs rotated over twice the L2,
timings above the peak refused.
"""

from __future__ import annotations

import bisect
import functools
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass

from croqq.domain import source
from croqq.domain.source import HeaderResolver
from croqq.errors import CroqqError

WORKSPACE_INCLUDE = "include/"  # the workspace's read-only header copies, by plain name below it
SHOWN_HEADERS = 6
TOKEN_CHARS = 60
BAD = "bad"  # a rule's pattern with this group reports only the matches where the group took part


class CheckFailed(CroqqError):
    """An answer refused before its source is checked (``size``, ``encoding``, or the workspace's own
    rules); the message is one line."""

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    message: str  # one line: "line N: what is wrong: how to fix it"


_TIMING = "host-side timing ({tok}) is not allowed: the harness times the kernel; remove it"
_CLOCK = (
    "a clock read ({tok}) is not allowed, in a kernel or on the host: the harness times the kernel; remove it"
)
_HARNESS = "call into the timing harness ({tok}) is not allowed: the harness calls launch(); leave it alone"
_MAIN = "defining main ({tok}) is not allowed: harness.cuh provides main(); define launch() only"
_NO_MAIN = "turning off the harness's main ({tok}) is not allowed: the harness runs and times the candidate"
_REFERENCE = "reading the verification reference ({tok}) is not allowed: compute C from the operands"
_OTHER_GEMM = "a GEMM that is not the candidate's own ({tok}) is not allowed: compute C in your kernel"
_RESET = "device control ({tok}) is not allowed: the harness owns the device and its context"
_ALLOC = (
    "memory of its own ({tok}) is not allowed: write only through the Operands the harness passes "
    "(c, workspace); use shared memory or registers for scratch"
)
_GLOBAL = (
    "a writable global ({tok}) is not allowed: use __constant__ for tables, shared memory or registers "
    "for scratch, the Operands for results"
)
_CAST = "an integer-to-pointer cast ({tok}) is not allowed: write only through the Operands' pointers"

# (rule, pattern, message); CODE rules see the text without comments and with strings emptied, ASM rules
# (inline PTX lives in strings) the text without comments only.
_CODE: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (rule, re.compile(pattern), message)
    for rule, pattern, message in (
        ("host-timing", r"\bcu(?:da)?Event\w*", _TIMING),
        ("host-timing", r"\bchrono\b", _TIMING),
        ("host-timing", r"\b(?:clock_gettime|gettimeofday|time|timespec_get)(?=\s*\()", _TIMING),
        ("host-timing", r"\b(?:clock(?:64)?)(?=\s*\()|\b\w*globaltimer\w*", _CLOCK),
        ("host-timing", r"\b(?:__)?rdtscp?\b|\bQueryPerformanceCounter\b", _TIMING),
        ("harness-call", r"\bcroqq\s*::\s*harness\b|\bharness\s*::|\bnamespace\s+harness\b", _HARNESS),
        ("harness-call", r"\b(?:main_impl|croqq_fill_\w*|croqq_compare|CROQQ_CHECK|fail_cuda)\b", _HARNESS),
        ("main", r"(?<![\w.>:])main(?=\s*\()", _MAIN),
        ("main", r"\bCROQQ_NO_MAIN\b", _NO_MAIN),
        (
            "reference-read",
            r"\b(?:croqq_reference_gemm|[cC][uU][bB][lL][aA][sS]\w*|dl(?:m?open|v?sym))\b",
            _REFERENCE,
        ),
        (
            "reference-read",
            r"\bcutlass\s*::\s*(?:reference|library)\b|\breference\s*::\s*(?:device|host)\b"
            r"|\bcutlass/(?:util/reference|library)/[\w./]*",
            _OTHER_GEMM,
        ),
        ("device-reset", r"\bcudaDeviceReset\b|\bcudaSetDevice\w*|\bcu(?:DevicePrimaryCtx|Ctx)\w*", _RESET),
        (
            "foreign-memory",
            r"\bcuda(?:Malloc|Free|Memcpy|HostAlloc|HostRegister|GetSymbolAddress)\w*|\bcuMem\w*"
            r"|\b(?:malloc|calloc|realloc|free|aligned_alloc|posix_memalign|mmap)(?=\s*\()|\bnew\b(?=\s*[\w(:])",
            _ALLOC,
        ),
        # zeroing an operand the harness passed (the split-K workspace) is the one memset allowed
        (
            "foreign-memory",
            r"\bcudaMemset\w*(?=\s*\()(?!\s*\(\s*\w+\s*(?:\.|->)\s*(?:workspace|c)\s*,)",
            _ALLOC,
        ),
        ("foreign-memory", r"\b__managed__\b", _GLOBAL),
        # a __device__ declaration that reaches ; = or [ before any ( is a variable, not a function; the
        # match always takes the whole declaration head (linear time), a finding only when "bad" took part
        (
            "foreign-memory",
            r"\b__device__\b(?:[^;{}()=\[]*?\b(?:__constant__|__shared__|constexpr|operator)\b[^;{}()=\[]*+"
            r"|[^;{}()=\[]*+(?P<bad>[;=\[])?)",
            _GLOBAL,
        ),
        (
            "foreign-memory",
            r"\breinterpret_cast\s*<[^<>;]*\*\s*>\s*\(\s*(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*\s*\)"
            r"|\(\s*(?:const\s+|volatile\s+)*[\w:]+(?:\s+const)?\s*\*+\s*\)\s*\(?\s*(?:0[xX][0-9a-fA-F]+|[1-9]\d*)",
            _CAST,
        ),
    )
)
# a rule runs only when one of its words (lower case) occurs in the text: most sources trigger few rules,
# which keeps the checks of a 2,000-line kernel in milliseconds; () = always run
_TRIGGERS: tuple[tuple[str, ...], ...] = (
    ("event",),
    ("chrono",),
    ("clock", "gettimeofday", "time"),
    ("clock", "globaltimer"),
    ("rdtsc", "queryperformancecounter"),
    ("harness",),
    ("main_impl", "croqq_fill_", "croqq_compare", "croqq_check", "fail_cuda"),
    ("main",),
    ("croqq_no_main",),
    ("croqq_reference_gemm", "cublas", "dlopen", "dlmopen", "dlsym", "dlvsym"),
    ("reference", "library"),
    ("cudadevicereset", "cudasetdevice", "cudeviceprimaryctx", "cuctx"),
    ("cuda", "cumem", "alloc", "free", "mmap", "new"),
    ("cudamemset",),
    ("__managed__",),
    ("__device__",),
    (),
)
assert len(_TRIGGERS) == len(_CODE)
_ASM: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("host-timing", re.compile(r"%+(?:globaltimer\w*|clock(?:64)?)\b"), _CLOCK),
    ("host-timing", re.compile(r"\brdtscp?\b"), _TIMING),
)
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(?:include|import)\w*\b[^\n]*", re.MULTILINE)


def _liner(text: str) -> Callable[[int], int]:
    """offset -> 1-based line of ``text`` (in log time: a source full of findings stays linear)."""
    starts = [m.end() for m in re.finditer("\n", text)]
    return lambda at: bisect.bisect_right(starts, at) + 1


def _token(text: str) -> str:
    token = " ".join(text.split())
    return token if len(token) <= TOKEN_CHARS else token[: TOKEN_CHARS - 3] + "..."


def _include_problem(
    angle: bool, path: str, resolver: HeaderResolver, names: Callable[[], tuple[str, ...]]
) -> tuple[str, str] | None:
    """(rule, what is wrong) for one include, None when it is fine."""
    if path.startswith("/"):
        return "absolute-include", "is an absolute path: include a header by its plain name"
    if ".." in re.split(r"[/\\]", path):
        return "escaping-include", "leaves the include folders (..): include a header by its plain name"
    plain = path[len(WORKSPACE_INCLUDE) :] if path.startswith(WORKSPACE_INCLUDE) else path
    if angle or any(posixpath.normpath(p) in names() and resolver.resolve(p) for p in (path, plain)):
        return None  # a toolchain header, or one of croqq's
    offered = ", ".join(names()[:SHOWN_HEADERS]) + (", ..." if len(names()) > SHOWN_HEADERS else "")
    return "unknown-include", f"is no header croqq provides: include one of {offered or 'none'}"


def _include_findings(text: str, resolver: HeaderResolver) -> list[Finding]:
    # source.INCLUDE is what source.includes() reads; used directly (with one verdict per distinct
    # include) so a source of many include lines stays linear
    found: list[Finding] = []
    checked: set[int] = set()
    verdicts: dict[tuple[bool, str], tuple[str, str] | None] = {}
    line_of = _liner(text)
    names = functools.cache(lambda: tuple(resolver.names()))  # listed once, when first needed
    for m in source.INCLUDE.finditer(text):
        line, angle, path = line_of(m.start()), m.group(2) == "<", m.group(3).strip()
        checked.add(line)
        if (angle, path) not in verdicts:
            verdicts[angle, path] = _include_problem(angle, path, resolver, names)
        if problem := verdicts[angle, path]:
            shown = _token(f"<{path}>" if angle else f'"{path}"')
            found.append(Finding(problem[0], line, f"line {line}: #include {shown} {problem[1]}"))
    for m in _DIRECTIVE.finditer(text):
        line = line_of(m.start())
        if line not in checked:
            message = f"line {line}: {_token(m.group(0))} cannot be checked: #include a header by its name"
            found.append(Finding("unknown-include", line, message))
    return found


# a self-timed kernel's own business: its main, timer and buffers (croqq does not verify its result)
SELF_TIMED_OWN = frozenset({"host-timing", "harness-call", "main", "foreign-memory"})


def check_source(
    text: str, resolver: HeaderResolver, name: str = "candidate.cu", self_timed: bool = False
) -> list[Finding]:
    """Every finding, by line; [] means the source may be built. ``name`` is only for the caller's
    messages (a finding's message starts with its line). A candidate of a self-timed family brings its
    own ``main`` and timer (its timing is recorded as self-reported): those rules do not apply to it."""
    del name
    uncommented = source.strip_comments(text)  # comments keep their newlines: lines stay right
    code = source.strip_comments(text, strings=True)
    found = _include_findings(uncommented, resolver)
    for view, rules, triggers in ((code, _CODE, _TRIGGERS), (uncommented, _ASM, ((),) * len(_ASM))):
        line_of = _liner(view)
        low = view.lower()
        for (rule, pattern, message), words in zip(rules, triggers, strict=True):
            if (words and not any(w in low for w in words)) or (self_timed and rule in SELF_TIMED_OWN):
                continue
            for m in pattern.finditer(view):
                if BAD in pattern.groupindex and m.group(BAD) is None:
                    continue
                line = line_of(m.start())
                found.append(Finding(rule, line, f"line {line}: " + message.format(tok=_token(m.group(0)))))
    return sorted(dict.fromkeys(found), key=lambda f: (f.line, f.rule))


def check_size(size: int, max_bytes: int, name: str = "candidate.cu") -> None:
    """Refuse a source over ``max_bytes`` by its size alone (before it is read)."""
    if size > max_bytes:
        raise CheckFailed(
            f"{name}: {size} bytes is over the limit of {max_bytes} bytes: submit one smaller source", "size"
        )


def check_bytes(data: bytes, max_bytes: int, name: str = "candidate.cu") -> str:
    """The decoded text of a candidate file, or CheckFailed for over-size (checked first) or non-UTF-8."""
    check_size(len(data), max_bytes, name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckFailed(f"{name}: not UTF-8 (byte {err.start}): save it as UTF-8", "encoding") from None
    if "\x00" in text:
        at = text.index("\x00")
        raise CheckFailed(f"{name}: a NUL character (at {at}) is no source text: remove it", "encoding")
    return text
