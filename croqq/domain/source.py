"""Candidates as sources: normalization, includes, the header closure, the content hash, the stored form.

A candidate is one translation unit (its *logical* form: quoted includes name headers of the manifest's
include folders by their plain name, e.g. ``#include "gemm_f16.cuh"``) plus the headers it includes,
transitively. Its identity is :func:`content_hash`: the normalized source, the name and content of every
header of the closure, the compiler flags and the compiler version. An edited header or a new nvcc is a
new candidate; a candidate that differs only in comments or whitespace is the same one.

In the results repo a candidate is stored compilable from the repo alone (:func:`stored_files`): every
header of its closure once per distinct content under ``<run root>/headers/<hash16>/<name>``, each quoted
include (in the candidate and in the stored headers) rewritten to the relative path of that file. The
hash of a stored header covers its rewritten includes, so it names its whole sub-closure (a Merkle DAG):
``nvcc <flags> shapes/<key>/srcs/iter007_x.cu`` needs no ``-I``. :func:`load_stored` is the way back, for
``croqq measure --source FILE``.

Pure: no I/O except reading header files through a :class:`HeaderResolver`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from croqq.errors import CroqqError

INCLUDE = re.compile(r'^([ \t]*#[ \t]*include[ \t]*)([<"])([^>"\n]*)([>"])', re.MULTILINE)
DEFINE = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+\(?(-?\d+)\)?[ \t]*$", re.MULTILINE | re.ASCII
)
_TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)
HEADERS_DIR = "headers"
HEADER_SUFFIXES = (".cuh", ".h", ".hpp", ".inc")
HASH_CHARS = 16


class SourceError(CroqqError):
    """A source that cannot be a candidate (an include that does not resolve, a cycle); one line."""


@dataclass(frozen=True)
class Include:
    line: int
    angle: bool  # <...> (the toolchain's headers) or "..." (a croqq header)
    path: str


def includes(text: str) -> list[Include]:
    """The ``#include`` lines of a source, in order (commented-out ones included: a check is strict)."""
    found, line, pos = [], 1, 0
    for m in INCLUDE.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        found.append(Include(line, m.group(2) == "<", m.group(3).strip()))
    return found


def strip_comments(text: str, strings: bool = False) -> str:
    """The source without comments (and, with ``strings``, string and char literals emptied)."""

    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith("//"):
            return ""
        if tok.startswith("/*"):
            return " " + "\n" * tok.count("\n")
        return tok[0] * 2 if strings else tok

    return _TOKENS.sub(repl, text)


@functools.lru_cache(maxsize=64)
def normalize(text: str) -> str:
    """Comments removed, runs of blanks collapsed, blank lines dropped: what the hash and repeats see
    (cached: a step normalizes the same best source several times)."""
    lines = (" ".join(line.split()) for line in strip_comments(text).splitlines())
    return "\n".join(line for line in lines if line) + "\n"


def knob_values(text: str, names: Iterable[str]) -> dict[str, int]:
    """The integer ``#define`` of each knob name the source sets (the last one wins, like cpp)."""
    wanted = set(names)
    found: dict[str, int] = {}
    for m in DEFINE.finditer(strip_comments(text)):
        if m.group(1) in wanted:
            found[m.group(1)] = int(m.group(2))
    return dict(sorted(found.items()))


SHAPE_MACROS = ("GEMM_M", "GEMM_N", "GEMM_K")


def retarget_shape(text: str, dims: tuple[int, int, int]) -> str:
    """The source with its shape macros (``#define GEMM_M/N/K <int>``) set to ``dims``: how a kernel
    written for one shape is built for another. SourceError when a macro is not defined exactly once by
    such a line (the shape is hard-coded some other way, or redefined), naming it."""
    code = strip_comments(text)
    for name in SHAPE_MACROS:
        count = sum(1 for m in DEFINE.finditer(code) if m.group(1) == name)
        if count != 1:
            how = "is not defined" if count == 0 else f"is defined {count} times"
            raise SourceError(f"{name} {how} by one #define line: the shape cannot be re-targeted")
    values = dict(zip(SHAPE_MACROS, dims, strict=True))

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            return m.group(0)
        return m.group(0)[: m.start(2) - m.start(0)].rstrip("(") + str(values[name])

    return DEFINE.sub(repl, text)


def structure(text: str, knob_names: Iterable[str]) -> str:
    """The normalized source with the knob ``#define`` lines removed: equal for two sources that differ
    only in knob values (a knob-only change), different for a structural edit."""
    wanted = set(knob_names)
    kept = [
        line
        for line in normalize(text).splitlines()
        if not ((m := DEFINE.match(line)) and m.group(1) in wanted)
    ]
    return "\n".join(kept) + "\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- headers -----------------------------------------------------------------------------------------


_RESOLVED: dict[tuple[tuple[Path, ...], str], Path] = {}


def _resolve(dirs: tuple[Path, ...], name: str) -> Path | None:
    """Where a header name resolves. Found ones are cached per process (include folders do not move;
    an edited header's new content is still seen: :func:`read_header` checks its stamp)."""
    hit = _RESOLVED.get((dirs, name))
    if hit is not None:
        return hit
    found = _lookup(dirs, name)
    if found is not None:
        _RESOLVED[dirs, name] = found
    return found


def _lookup(dirs: tuple[Path, ...], name: str) -> Path | None:
    if not name or name.startswith("/") or "\\" in name or ".." in name.split("/"):
        return None
    if not name.endswith(HEADER_SUFFIXES):
        return None
    for folder in dirs:
        root = folder.resolve()
        path = (folder / name).resolve()
        if path.is_file() and path.is_relative_to(root):
            return path
    return None


@dataclass(frozen=True)
class HeaderResolver:
    """Finds a quoted include in the manifest's include folders (and nowhere else)."""

    dirs: tuple[Path, ...]

    def resolve(self, name: str) -> Path | None:
        return _resolve(self.dirs, name)

    def names(self) -> list[str]:
        """Every header name the include folders offer (what an agent may include)."""
        return sorted(
            {
                p.relative_to(d).as_posix()
                for d in self.dirs
                for p in d.rglob("*")
                if p.is_file() and p.name.endswith(HEADER_SUFFIXES)
            }
        )


@functools.lru_cache(maxsize=256)
def _quoted(text: str) -> tuple[Include, ...]:
    """The quoted includes of a header's text (cached: headers are the same few texts over and over)."""
    return tuple(inc for inc in includes(text) if not inc.angle)


@functools.lru_cache(maxsize=256)
def _digest(text: str) -> str:
    return sha256(text)


def header_closure(text: str, read: Callable[[str], str | None]) -> dict[str, str]:
    """name -> content of every header the source includes with quotes, transitively.

    ``read(name)`` returns a header's text or None when it does not resolve (a SourceError)."""
    found: dict[str, str] = {}
    todo = [(inc, "the candidate") for inc in includes(text) if not inc.angle]
    while todo:
        inc, where = todo.pop()
        if inc.path in found:
            continue
        body = read(inc.path)
        if body is None:
            raise SourceError(
                f'{where} line {inc.line}: #include "{inc.path}" is not a header of the include folders'
            )
        found[inc.path] = body
        todo += [(sub, inc.path) for sub in _quoted(body)]
    return dict(sorted(found.items()))


_FILES: dict[Path, tuple[tuple[int, int], str]] = {}  # path -> ((mtime_ns, size), text)


def read_header(path: Path) -> str:
    """A header's text, cached while its mtime and size stay the same."""
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _FILES.get(path)
    if hit is None or hit[0] != stamp:
        hit = (stamp, path.read_text(encoding="utf-8"))
        _FILES[path] = hit
    return hit[1]


def read_from(resolver: HeaderResolver) -> Callable[[str], str | None]:
    def read(name: str) -> str | None:
        path = resolver.resolve(name)
        return read_header(path) if path is not None else None

    return read


def content_hash(source: str, headers: Mapping[str, str], flags: Iterable[str], toolchain: str) -> str:
    """The candidate's identity (see the module docstring)."""
    payload = {
        "source": normalize(source),
        "headers": {name: _digest(body) for name, body in sorted(headers.items())},
        "flags": list(flags),
        "toolchain": toolchain,
    }
    return sha256(json.dumps(payload, sort_keys=True))


# -- the stored form ---------------------------------------------------------------------------------


def rewrite_includes(text: str, target: Callable[[str], str | None]) -> str:
    """Replace each quoted include whose ``target(path)`` is not None with that path."""

    def repl(m: re.Match[str]) -> str:
        new = target(m.group(3).strip()) if m.group(2) == '"' else None
        return m.group(0) if new is None else f'{m.group(1)}"{new}"'

    return INCLUDE.sub(repl, text)


def _store_header(
    name: str,
    headers: Mapping[str, str],
    root: str,
    done: dict[str, str],
    files: dict[str, str],
    stack: set[str],
) -> str:
    if name in done:
        return done[name]
    if name in stack:
        raise SourceError(f'#include cycle through "{name}"')
    stack.add(name)
    body = headers[name]
    deps = {inc.path for inc in includes(body) if not inc.angle and inc.path in headers}
    paths = {dep: _store_header(dep, headers, root, done, files, stack) for dep in sorted(deps)}
    stack.discard(name)
    # the header's own folder is <root>/headers/<hash>/<dirname(name)>; includes are relative to it
    folder_of = posixpath.dirname(name)

    def target_for(path: str, here: str) -> str | None:
        return posixpath.relpath(paths[path], here) if path in paths else None

    # the hash covers the includes as rewritten relative to a placeholder folder of the same depth,
    # so it does not depend on itself
    placeholder = posixpath.join(root, HEADERS_DIR, "_" * HASH_CHARS, folder_of)
    digest = sha256(rewrite_includes(body, lambda p: target_for(p, placeholder)))[:HASH_CHARS]
    path = posixpath.join(root, HEADERS_DIR, digest, name)
    files[path] = rewrite_includes(body, lambda p: target_for(p, posixpath.dirname(path)))
    done[name] = path
    return path


@functools.lru_cache(maxsize=64)
def _stored_headers(root: str, headers: tuple[tuple[str, str], ...]) -> tuple[dict[str, str], dict[str, str]]:
    """({name: stored path}, {stored path: text}) of a header closure (cached: a run stores the same
    closure with every iteration)."""
    closure = dict(headers)
    done: dict[str, str] = {}
    files: dict[str, str] = {}
    for name in sorted(closure):
        _store_header(name, closure, root, done, files, set())
    return done, files


def stored_files(root: str, src_path: str, source: str, headers: Mapping[str, str]) -> dict[str, str]:
    """repo path -> text of everything that makes the candidate compile from the repo alone: the source
    at ``src_path`` with its quoted includes rewritten, and each header of the closure under
    ``<root>/headers/<hash16>/<name>`` (the same content always lands on the same path)."""
    done, stored = _stored_headers(root, tuple(sorted(headers.items())))
    files = dict(stored)
    here = posixpath.dirname(src_path)
    files[src_path] = rewrite_includes(
        source, lambda p: posixpath.relpath(done[p], here) if p in done else None
    )
    return files


def load_stored(path: str, read: Callable[[str], str | None]) -> tuple[str, dict[str, str]]:
    """A stored (or any) source back to its logical form and header closure. ``path`` is POSIX (a repo
    path, or an absolute file path); ``read(path)`` gives a file's text or None. Quoted includes are
    resolved relative to the including file, as a compiler does, and renamed to their plain names
    (a stored header's path ends in its name)."""
    text = read(path)
    if text is None:
        raise SourceError(f"{path}: no such file")
    headers: dict[str, str] = {}
    prefix = f"/{HEADERS_DIR}/"

    def logical(body: str, where: str) -> str:
        def target(inc: str) -> str | None:
            if inc.startswith("/"):
                raise SourceError(f'{where}: #include "{inc}" is absolute')
            found = posixpath.normpath(posixpath.join(posixpath.dirname(where), inc))
            content = read(found)
            if content is None:
                raise SourceError(f'{where}: #include "{inc}" not found next to the file')
            tail = found.split(prefix, 1)[1].split("/", 1) if prefix in found else []
            name = tail[1] if len(tail) == 2 else posixpath.basename(found)
            if name not in headers:
                headers[name] = ""  # reserved: an include cycle stops here
                headers[name] = logical(content, found)
            return name

        return rewrite_includes(body, target)

    source = logical(text, path)
    return source, dict(sorted(headers.items()))


def read_file(path: str) -> str | None:
    """``read`` for :func:`load_stored` over the local filesystem."""
    file = Path(path)
    return file.read_text(encoding="utf-8") if file.is_file() else None
