"""Writing git objects for one commit: into one small pack file (fast path) or through libgit2.

Why packs: a STORE commit creates a score of objects (blobs, the trees on their paths, the commit); as
loose objects each is a file to create, write and rename. :class:`PackSink` writes them as ONE pack
(``objects/pack/pack-<sha>.pack`` + ``.idx``, git's documented version 2, no deltas): two files per
commit whatever the number of objects. git's own repack (``croqq.store._repack``) later rolls these
small packs into bigger ones with deltas. A pack becomes visible when its ``.idx`` appears (renamed
last); with ``fsync`` (the default) each file is fsynced before its rename and the folder after both,
so a pack is durable before the branch moves onto its commit.

Trees (:class:`Trees`) mirror the tip's folders in memory; a commit writes only the blobs and trees that
differ from the tip (an unchanged file, or a folder that ends up the same, is not written again).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pygit2

from croqq.errors import InvalidRecordError
from croqq.store._fsync import fsync_path

log = logging.getLogger(__name__)

TYPE_CODES = {b"commit": 1, b"tree": 2, b"blob": 3}
BLOB = int(pygit2.enums.FileMode.BLOB)
TREE = int(pygit2.enums.FileMode.TREE)
UNSET = object()
Entry = tuple[int, pygit2.Oid]
IDX_MAGIC = b"\xfftOc"
WRITE_TRIES = 3
LEVEL = 1  # zlib level at commit time: fast; git's repack keeps the bytes of objects it does not deltify


def object_id(kind: bytes, body: bytes) -> bytes:
    digest = hashlib.sha1(b"%s %d\x00" % (kind, len(body)))
    digest.update(body)
    return digest.digest()


def entry_header(code: int, size: int) -> bytes:
    """A pack entry's type-and-size header (``code``: 1 commit, 2 tree, 3 blob)."""
    byte = (code << 4) | (size & 0x0F)
    size >>= 4
    header = bytearray()
    while size:
        header.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    header.append(byte)
    return bytes(header)


def _entry(kind: bytes, body: bytes) -> bytes:
    """One pack entry: the type-and-size header, then the zlib-compressed body."""
    return entry_header(TYPE_CODES[kind], len(body)) + zlib.compress(body, LEVEL)


@dataclass
class _Entries:
    """Pack entries keyed by object id (raw): (crc32, entry bytes), in pack order."""

    items: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)

    def add(self, oid: bytes, entry: bytes) -> None:
        if oid not in self.items:
            self.items[oid] = (zlib.crc32(entry), entry)


def _write_pack(folder: Path, entries: _Entries, fsync: bool) -> Path:
    """Write ``pack-<sha>.pack`` then its ``.idx`` (durable on return with ``fsync``); returns the path
    without suffix."""
    names = sorted(entries.items)
    order = list(entries.items)
    offsets: dict[bytes, int] = {}
    chunks = [b"PACK" + struct.pack(">II", 2, len(order))]
    position = len(chunks[0])
    for oid in order:
        offsets[oid] = position
        chunks.append(entries.items[oid][1])
        position += len(chunks[-1])
    body = b"".join(chunks)
    checksum = hashlib.sha1(body).digest()
    fanout, counts = [], [0] * 256
    for oid in names:
        counts[oid[0]] += 1
    total = 0
    for count in counts:
        total += count
        fanout.append(total)
    index = b"".join(
        [
            IDX_MAGIC + struct.pack(">I", 2),
            struct.pack(">256I", *fanout),
            *names,
            struct.pack(f">{len(names)}I", *(entries.items[o][0] for o in names)),
            struct.pack(f">{len(names)}I", *(offsets[o] for o in names)),
            checksum,
        ]
    )
    stem = folder / f"pack-{checksum.hex()}"
    _publish(folder, stem.with_suffix(".pack"), body + checksum, fsync)
    try:
        _publish(folder, stem.with_suffix(".idx"), index + hashlib.sha1(index).digest(), fsync)
    except OSError:  # a pack without its index is garbage to git: leave none (a retry writes both)
        with contextlib.suppress(OSError):
            os.unlink(stem.with_suffix(".pack"))
        raise
    if fsync:
        fsync_path(folder)  # the two new names
    return stem


def _publish(folder: Path, final: Path, data: bytes, fsync: bool) -> None:
    tmp = folder / f"tmp_pack_croqq_{os.getpid()}_{threading.get_ident()}"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444), "wb") as fh:
            fh.write(data)
        if fsync:
            fsync_path(tmp)  # before the rename: the final name never points at unwritten data
        os.replace(tmp, final)
    except OSError:  # a full disk: no partial file is left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class PackSink:
    """Collects one commit's objects and writes them as one pack on :meth:`flush`."""

    def __init__(self, folder: Path, fsync: bool = True) -> None:
        self.folder = folder
        self.fsync = fsync
        self.entries = _Entries()

    def add(self, kind: bytes, body: bytes, known: pygit2.Oid | None = None) -> pygit2.Oid:
        """Add an object (``known``: its id, when the caller has hashed it already)."""
        oid = known.raw if known is not None else object_id(kind, body)
        if oid not in self.entries.items:
            self.entries.add(oid, _entry(kind, body))
        return pygit2.Oid(raw=oid)

    def flush(self) -> Path | None:
        return _write_pack(self.folder, self.entries, self.fsync) if self.entries.items else None


class LibgitSink:
    """The same interface over libgit2's object database (loose objects), for repos PackSink cannot serve.
    With ``fsync``, :meth:`flush` fsyncs the loose files written and their folders."""

    def __init__(self, repo: pygit2.Repository, fsync: bool = True) -> None:
        self._repo = repo
        self.fsync = fsync
        self._written: list[pygit2.Oid] = []

    def add(self, kind: bytes, body: bytes, known: pygit2.Oid | None = None) -> pygit2.Oid:
        types = {b"commit": pygit2.enums.ObjectType.COMMIT, b"tree": pygit2.enums.ObjectType.TREE}
        kind_id = types.get(kind, pygit2.enums.ObjectType.BLOB)
        for attempt in range(WRITE_TRIES):
            try:
                oid = self._repo.odb.write(kind_id, body)
                break
            except OSError:  # `git repack -d` pruned the object's empty folder under libgit2's write
                if attempt == WRITE_TRIES - 1:
                    raise
        self._written.append(oid)
        return oid

    def flush(self) -> Path | None:
        if self.fsync:
            objects = Path(self._repo.path) / "objects"
            for oid in self._written:
                with contextlib.suppress(FileNotFoundError):  # already stored in a pack: nothing written
                    fsync_path(objects / str(oid)[:2] / str(oid)[2:])
            for folder in {str(oid)[:2] for oid in self._written}:
                with contextlib.suppress(FileNotFoundError):
                    fsync_path(objects / folder)
            fsync_path(objects)
        return None


Sink = PackSink | LibgitSink


# -- the tip's trees, mirrored ----------------------------------------------------------------------


@dataclass
class Node:
    """Changes below one tree: a direct write/delete of this name and changes inside it."""

    data: object = UNSET
    children: dict[str, Node] = field(default_factory=dict)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _sort_key(name: str, mode: int) -> str:
    """git's tree order: a folder sorts as if its name ended with '/'."""
    return name + "/" if mode == TREE else name


class _Folder:
    """One tree's entries (name -> (mode, id)) with their serialized records kept in git's order, so that
    a changed folder is re-serialized by splicing one record instead of sorting all of them."""

    __slots__ = ("entries", "order", "records")

    def __init__(self, entries: dict[str, Entry], records: dict[str, bytes], order: list[str]) -> None:
        self.entries, self.records, self.order = entries, records, order

    @classmethod
    def load(cls, tree: pygit2.Tree) -> _Folder:
        folder = cls({}, {}, [])
        for e in tree:
            if e.name is not None:
                folder.entries[e.name] = (int(e.filemode), e.id)
                folder.records[_sort_key(e.name, int(e.filemode))] = _record(e.name, int(e.filemode), e.id)
        folder.order = sorted(folder.records)
        return folder

    def copy(self) -> _Folder:
        return _Folder(dict(self.entries), dict(self.records), list(self.order))

    def remove(self, name: str) -> bool:
        old = self.entries.pop(name, None)
        if old is None:
            return False
        key = _sort_key(name, old[0])
        del self.records[key]
        del self.order[bisect.bisect_left(self.order, key)]
        return True

    def set(self, name: str, mode: int, oid: pygit2.Oid) -> None:
        self.remove(name)
        key = _sort_key(name, mode)
        self.entries[name] = (mode, oid)
        self.records[key] = _record(name, mode, oid)
        bisect.insort(self.order, key)

    def data(self) -> bytes:
        return b"".join([self.records[key] for key in self.order])


def _record(name: str, mode: int, oid: pygit2.Oid) -> bytes:
    return b"%o %s\0%s" % (mode, name.encode(), oid.raw)


@dataclass
class Staged:
    """A commit's new trees, kept apart from the mirror until the branch has moved."""

    root: pygit2.Oid | None = None
    folders: dict[str, _Folder] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    blobs: dict[pygit2.Oid, bytes] = field(default_factory=dict)


class Trees:
    """The tip's trees mirrored lazily in memory (folder -> name -> (mode, id)).

    Path lookups cost dict reads instead of tree-object reads, and a commit serializes only the folders
    on its changed paths. Valid for one tip: on a foreign ref move the owner builds a new mirror.
    """

    def __init__(self, load: Callable[[pygit2.Oid], pygit2.Object], root: pygit2.Oid | None) -> None:
        self._load = load
        self.root = root
        self._folders: dict[str, _Folder] = {}

    def folder(self, path: str) -> _Folder | None:
        """A folder's entries (loaded once), None when there is no such folder."""
        found = self._folders.get(path)
        if found is not None:
            return found
        if path == "":
            oid = self.root
        else:
            entry = self.lookup(path)
            oid = entry[1] if entry is not None and entry[0] == TREE else None
        if oid is None:
            return None
        loaded = _Folder.load(self._load(oid).peel(pygit2.Tree))
        self._folders[path] = loaded
        return loaded

    def lookup(self, path: str) -> Entry | None:
        parent, _, name = path.rpartition("/")
        folder = self.folder(parent)
        return folder.entries.get(name) if folder is not None else None

    def stage(self, node: Node, sink: Sink) -> Staged:
        """Write the blobs and trees of ``node``'s changes into ``sink``; the mirror is not changed yet.
        What ends up identical to the tip (a file rewritten with the same bytes, hence its folders) is
        not written."""
        staged = Staged()
        staged.root = self._build("", node, False, staged, sink, self.root)
        return staged

    def _build(
        self, folder: str, node: Node, fresh: bool, staged: Staged, sink: Sink, old: pygit2.Oid | None
    ) -> pygit2.Oid | None:
        base = None if fresh else self.folder(folder)
        new = base.copy() if base is not None else _Folder({}, {}, [])
        entries = new.entries
        for name, child in node.children.items():
            path = _join(folder, name)
            prev = entries.get(name)
            if isinstance(child.data, bytes):
                if child.children:
                    raise InvalidRecordError(f"{path!r}: written as a file and as a folder in one commit")
                blob = pygit2.Oid(raw=object_id(b"blob", child.data))
                if prev != (BLOB, blob):
                    sink.add(b"blob", child.data, blob)
                staged.blobs[blob] = child.data
                if prev is not None and prev[0] == TREE:
                    staged.dropped.append(path)
                new.set(name, BLOB, blob)
                continue
            if child.data is None and new.remove(name):
                staged.dropped.append(path)
            if child.children:
                was_tree = prev is not None and prev[0] == TREE and child.data is UNSET
                sub = self._build(
                    path, child, fresh or not was_tree, staged, sink, prev[1] if was_tree and prev else None
                )
                if sub is None:
                    new.remove(name)
                else:
                    new.set(name, TREE, sub)
        staged.folders[folder] = new
        if not entries:
            return None
        data = new.data()
        tree = pygit2.Oid(raw=object_id(b"tree", data))
        if tree != old:
            sink.add(b"tree", data, tree)
        return tree

    def merge(self, staged: Staged, root: pygit2.Oid) -> None:
        """The staged commit is the tip now: adopt its trees."""
        for gone in staged.dropped:
            prefix = gone + "/"
            for path in [p for p in self._folders if p == gone or p.startswith(prefix)]:
                del self._folders[path]
        for path, folder in staged.folders.items():
            if folder.entries or path == "":
                self._folders[path] = folder
            else:
                self._folders.pop(path, None)
        self.root = root
