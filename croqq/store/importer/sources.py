"""Kernel sources of an imported tree, in croqq's logical form: each quoted ``#include`` resolved from the
including file's folder inside the tree, else from croqq's include folders. A header croqq's include
folders offer by the same file name is kept as an include of that name, so that the writer stores it
self-contained like every croqq source (:func:`croqq.domain.source.stored_files`, headers/<hash16>/); any
other header of the tree is inlined, so that the source also builds where croqq builds a resumed shape's
candidates (from its include folders only). An include that resolves in neither is commented out and
named: that source is not compilable. Reads only; never writes to the tree."""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from croqq.domain import source as src
from croqq.domain.source import INCLUDE

MAX_BYTES = 4 * 1024 * 1024  # a kernel source or header larger than this is not a source


@dataclass(frozen=True)
class TreeSource:
    """One source read from the tree: its logical text, its header closure (name -> text), the includes
    that did not resolve (each a one-line reason) and whether it is a kernel of croqq's family; either
    makes it not compilable (stored, never a best to resume from)."""

    path: str  # relative to the tree's root
    text: str
    headers: dict[str, str] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)
    foreign: str = ""  # why croqq's family of the dsl cannot build it ('' when it can)

    @property
    def compilable(self) -> bool:
        return not self.unresolved and not self.foreign


def as_text(data: bytes) -> tuple[str | None, str]:
    """A file's bytes as text (UTF-8, a byte-order mark dropped), or None and why not."""
    if b"\0" in data:
        return None, "binary file"
    try:
        return data.decode("utf-8-sig"), ""
    except UnicodeDecodeError:
        return None, "not UTF-8 text"


def _read(root: Path, rel: str) -> str | None:
    """A file's text, when ``rel`` stays inside the tree and it is a readable UTF-8 text file."""
    if not rel or rel.startswith("/") or "\\" in rel:
        return None
    norm = posixpath.normpath(rel)
    if norm == ".." or norm.startswith("../"):
        return None
    path = root / norm
    try:
        if not path.resolve().is_relative_to(root.resolve()) or not path.is_file():
            return None
        if path.stat().st_size > MAX_BYTES:
            return None
        return as_text(path.read_bytes())[0]
    except OSError:
        return None


def _inline(text: str, headers: dict[str, str], names: dict[str, str], kept: set[str], seen: set[str]) -> str:
    """``text`` with each quoted include of a header croqq does not offer replaced by that header's text
    (once; ``#pragma once`` dropped), and each one it offers renamed to its plain name."""

    def repl(m: re.Match[str]) -> str:
        path = m.group(3).strip()
        if m.group(2) == "<" or path not in headers:
            return m.group(0)
        if path in kept:
            return f'{m.group(1)}"{names[path]}"'
        if path in seen:
            return f'// croqq import: "{names[path]}" inlined above'
        seen.add(path)
        body = "\n".join(line for line in headers[path].splitlines() if line.split() != ["#pragma", "once"])
        inner = _inline(body, headers, names, kept, seen)
        return f'// croqq import: begin "{names[path]}"\n{inner}\n// croqq import: end "{names[path]}"'

    return INCLUDE.sub(repl, text)


def _plain_names(headers: dict[str, str]) -> dict[str, str]:
    """Tree path -> the header's name in the closure: its file name when no other header of the closure
    has it (as croqq's own headers are named, so a tree's copy of one is included as croqq includes it),
    else its path in the tree."""
    count = Counter(posixpath.basename(path) for path in headers)
    return {
        path: posixpath.basename(path) if count[posixpath.basename(path)] == 1 else path for path in headers
    }


class SourceReader:
    """Reads sources of one tree, each header once. ``offered``: a header of croqq's include folders by
    name (None when croqq has none by that name). A header of the tree by one of those names is kept as an
    include, any other is inlined where it is first included, and an include the tree lacks but croqq
    offers resolves to croqq's; kept headers are stored with the source (headers/), so that it builds
    wherever croqq builds (a resumed shape's candidates are built from croqq's include folders only)."""

    def __init__(self, root: Path, offered: Callable[[str], str | None] = lambda name: None) -> None:
        self.root = root
        self.offered = offered
        self._texts: dict[str, str | None] = {}  # each file of the tree read once
        self._headers: dict[str, tuple[str, list[str], list[str]] | None] = {}

    def _text(self, rel: str) -> str | None:
        if rel not in self._texts:
            self._texts[rel] = _read(self.root, rel)
        return self._texts[rel]

    def read(self, rel: str) -> TreeSource | None:
        """The source at ``rel`` (relative to the root) in logical form; None when it cannot be read."""
        text = self._text(rel)
        if text is None:
            return None
        body, deps, unresolved = self._logical(rel, text)
        headers: dict[str, str] = {}
        todo = list(deps)
        while todo:
            name = todo.pop()
            if name in headers:
                continue
            entry = self._header(name)
            assert entry is not None  # deps only name headers that resolved
            headers[name], sub, bad = entry
            todo += sub
            unresolved += [r for r in bad if r not in unresolved]
        names = _plain_names(headers)
        kept = {path for path, name in names.items() if self.offered(name) is not None}
        body = _inline(body, headers, names, kept, set())
        ours: dict[str, str] = {}  # the tree's kept headers, by plain name
        todo = sorted(kept)
        while todo:  # a kept header's own includes are stored with it, as written
            path = todo.pop()
            if names[path] not in ours:
                text = headers[path]
                ours[names[path]] = src.rewrite_includes(text, names.get)
                todo += [inc.path for inc in src.includes(text) if not inc.angle and inc.path in headers]
        closure = src.header_closure(body, lambda name: ours.get(name) or self.offered(name))
        return TreeSource(rel, body, closure, unresolved)

    def _header(self, name: str) -> tuple[str, list[str], list[str]] | None:
        if name not in self._headers:
            self._headers[name] = None  # an include cycle stops here
            text = self._text(name)
            self._headers[name] = self._logical(name, text) if text is not None else None
        return self._headers[name]

    def _logical(self, rel: str, text: str) -> tuple[str, list[str], list[str]]:
        """The text with quoted includes renamed to tree paths (unresolved ones commented out), the
        names it includes, and the reasons of the unresolved ones."""
        deps: list[str] = []
        unresolved: list[str] = []

        def repl(m: re.Match[str]) -> str:
            if m.group(2) == "<":
                return m.group(0)
            inc = m.group(3).strip()
            target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), inc))
            if not inc.startswith("/") and self._text(target) is not None:
                self._header(target)  # read once (an include cycle finds it in progress)
                deps.append(target)
                return f'{m.group(1)}"{target}"'
            if self.offered(inc) is not None:
                return m.group(0)  # one of croqq's headers: stored with the source
            line = text.count("\n", 0, m.start()) + 1
            unresolved.append(f'{rel} line {line}: #include "{inc}" is not a file of the imported tree')
            return f'// croqq import: unresolved #include "{inc}"'

        return INCLUDE.sub(repl, text), deps, unresolved
