"""The writer's own repack: the packs this process wrote, merged in the background with deltas.

Every commit writes one small pack without deltas (``croqq.store._objects.PackSink``). :class:`PackStack`
merges them in a background thread, LSM-style: when ``fan`` packs of one level exist they become one
pack of the next level, so each object is rewritten about log_fan(commits) times and at most ``fan - 1``
packs per level stay on disk; :meth:`PackStack.close` merges whatever is left into one pack.

A merge writes a self-contained pack (git reads no thin pack from disk): entries already stored as
deltas (``OFS_DELTA``, base earlier in the same pack) are copied with their distance re-encoded; an
object that replaced another at the same path (its *hint*, ``_Entries.hints``) whose previous version is
among the merged packs becomes an ``OFS_DELTA`` against that version (``croqq.store._delta``), up to
``MAX_DEPTH`` deltas deep; objects written uncompressed are compressed. So a file that a commit appends
to or changes one line of costs, once merged, about the bytes that changed, not the file's size. The
previous version of an appended file is never rebuilt: its id is checked against the new version's
prefix (same size, same hash), so the delta is one copy and the appended bytes. Hints live in memory
only: packs left by an earlier process, and merges beyond ``MAX_PACK_BYTES``, are left to ``git gc``.

Crash safety: the thread only reads, writes and deletes pack files, never touching libgit2. A merged
pack is complete and (with ``fsync``) durable, ``.pack`` then ``.idx``, each fsynced before its rename
and the folder after, before the packs it replaces are deleted (index first), so every object is always
in some pack: a kill at any moment leaves at worst the same objects twice.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from croqq.store._delta import append_delta, apply_delta, delta_sizes, make_delta
from croqq.store._objects import (
    MAX_PACK_BYTES,
    OFS_DELTA,
    PACK_HEADER_BYTES,
    _Entries,
    _write_pack,
    entry_header,
    ofs_distance,
    parse_header,
)

log = logging.getLogger(__name__)

MAX_DEPTH = 128  # longest delta chain (a read applies at most this many deltas)
MAX_REBUILT_BYTES = 4 << 20  # a changed (not appended) object this big is not delta-compressed
CACHE_BYTES = 64 << 20  # rebuilt objects kept during one merge
LEVEL = 6
KINDS = {1: b"commit", 2: b"tree", 3: b"blob"}


@dataclass(eq=False)
class _Pack:
    stem: Path
    level: int
    size: int
    entries: _Entries | None = None  # kept in memory for the first merge (no re-read of small files)
    hints: dict[bytes, bytes] = field(default_factory=dict)  # full objects -> their previous version
    raw: set[bytes] = field(default_factory=set)  # objects stored uncompressed


def _source(pack: _Pack) -> list[tuple[bytes, int, bytes]]:
    """(object id, offset, entry bytes) of every entry, in pack order; [] when the pack is gone."""
    if pack.entries is not None:
        out, position = [], PACK_HEADER_BYTES
        for oid, (_, entry) in pack.entries.items.items():
            out.append((oid, position, entry))
            position += len(entry)
        return out
    try:
        index = pack.stem.with_suffix(".idx").read_bytes()
        data = pack.stem.with_suffix(".pack").read_bytes()
    except FileNotFoundError:  # `git gc` repacked it meanwhile: its objects live on in gc's pack
        return []
    count = struct.unpack(">I", index[8 + 255 * 4 : 8 + 256 * 4])[0]
    base = 8 + 256 * 4
    names = [index[base + 20 * i : base + 20 * (i + 1)] for i in range(count)]
    base += 24 * count  # names, then crcs
    offsets = struct.unpack(f">{count}I", index[base : base + 4 * count])
    order = sorted(zip(offsets, names, strict=True))
    ends = [start for start, _ in order[1:]] + [len(data) - 20]
    return [(oid, start, data[start:end]) for (start, oid), end in zip(order, ends, strict=True)]


class Bodies:
    """Recently rebuilt or merged objects' bytes by id, kept across merges (bounded)."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit = limit
        self._items: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0

    def get(self, oid: bytes) -> bytes | None:
        data = self._items.get(oid)
        if data is not None:
            self._items.move_to_end(oid)
        return data

    def put(self, oid: bytes, data: bytes) -> None:
        if len(data) > self.limit // 8 or oid in self._items:
            return
        self._items[oid] = data
        self._bytes += len(data)
        while self._bytes > self.limit:
            _, old = self._items.popitem(last=False)
            self._bytes -= len(old)


class _Merge:
    """One merged pack being built, in pack order, with what deltas against it need."""

    def __init__(self, bodies: Bodies) -> None:
        self.out = _Entries()
        self.offsets: dict[bytes, int] = {}
        self.at: dict[int, bytes] = {}
        self.position = PACK_HEADER_BYTES
        self.bodies = bodies

    def add(self, oid: bytes, entry: bytes) -> None:
        self.offsets[oid] = self.position
        self.at[self.position] = oid
        self.out.add(oid, entry)
        self.position += len(entry)

    def _base_of(self, oid: bytes, distance: int) -> bytes:
        return self.at[self.offsets[oid] - distance]

    def rebuild(self, oid: bytes) -> bytes:
        """The bytes of an object already in the merged pack."""
        chain: list[bytes] = []
        cur, data = oid, self.bodies.get(oid)
        while data is None:
            entry = self.out.items[cur][1]
            code, _, length, distance = parse_header(entry)
            if code != OFS_DELTA:
                data = zlib.decompress(entry[length:])
                break
            chain.append(zlib.decompress(entry[length:]))
            cur = self._base_of(cur, distance)
            data = self.bodies.get(cur)
        for delta in reversed(chain):
            data = apply_delta(data, delta)
        self.bodies.put(oid, data)
        return data

    def describe(self, oid: bytes) -> tuple[int, int, int]:
        """(type code, object size, delta depth) of an object in the merged pack, without rebuilding it:
        a delta's result size is in its first bytes, its type is its chain's end's."""
        entry = self.out.items[oid][1]
        code, size, length, distance = parse_header(entry)
        if code == OFS_DELTA:
            size = delta_sizes(zlib.decompressobj().decompress(entry[length:], 32))[1]
        depth = 0
        while code == OFS_DELTA:
            depth += 1
            oid = self._base_of(oid, distance)
            code, _, _, distance = parse_header(self.out.items[oid][1])
        return code, size, depth

    def delta_entry(self, oid: bytes, code: int, data: bytes, base: bytes, height: int) -> bytes | None:
        """An OFS_DELTA entry for ``data`` against ``base`` (in this pack), None when not worth it or
        when it would make a chain (with the ``height`` deltas already on this object) too deep."""
        base_code, base_size, depth = self.describe(base)
        if base_code != code or depth + 1 + height > MAX_DEPTH:
            return None
        prefix = b"%s %d\x00" % (KINDS[code], base_size)
        if len(data) >= base_size and hashlib.sha1(prefix + data[:base_size]).digest() == base:
            delta = append_delta(base_size, data)  # appended: the base is not rebuilt
        elif base_size > MAX_REBUILT_BYTES:
            return None
        else:
            delta = make_delta(self.rebuild(base), data)
        if len(delta) > len(data) * 3 // 4:
            return None
        self.bodies.put(oid, data)
        body = zlib.compress(delta, LEVEL)
        return entry_header(OFS_DELTA, len(delta)) + ofs_distance(self.position - self.offsets[base]) + body


def _heights(entries: list[tuple[bytes, int, bytes]]) -> dict[int, int]:
    """For each full object of a source pack (by offset): how deep the deltas on it go in that pack."""
    root: dict[int, int] = {}
    depth: dict[int, int] = {}
    height: dict[int, int] = {}
    for _, start, entry in entries:
        code, _, _, distance = parse_header(entry)
        if code == OFS_DELTA:
            base = start - distance
            root[start], depth[start] = root[base], depth[base] + 1
            height[root[start]] = max(height[root[start]], depth[start])
        else:
            root[start], depth[start], height[start] = start, 0, 0
    return height


def merge_packs(packs: list[_Pack], folder: Path, fsync: bool, bodies: Bodies, final: bool = False) -> _Pack:
    """Write one self-contained pack of every object in ``packs`` (oldest first), with deltas. An object
    whose previous version is not among them stays as it was (uncompressed, if it was), for a later
    merge to store as a delta; with ``final`` it is compressed."""
    merge = _Merge(bodies)
    merged = _Pack(folder, packs[0].level + 1, 0)
    for pack in packs:
        moved: dict[int, int] = {}  # offset in the source pack -> offset in the merged one
        entries = _source(pack)
        heights = _heights(entries)
        for oid, start, entry in entries:
            if oid in merge.offsets:
                moved[start] = merge.offsets[oid]
                continue
            code, size, length, distance = parse_header(entry)
            written = entry
            if code == OFS_DELTA:
                back = merge.position - moved[start - distance]
                written = entry_header(OFS_DELTA, size) + ofs_distance(back) + entry[length:]
            elif oid in pack.hints or oid in pack.raw:
                written = _full_or_delta(merge, merged, pack, oid, entry, heights[start], final)
            moved[start] = merge.position
            merge.add(oid, written)
    merged.stem = _write_pack(folder, merge.out, fsync)
    merged.size = merge.position
    return merged


def _full_or_delta(
    merge: _Merge, merged: _Pack, pack: _Pack, oid: bytes, entry: bytes, height: int, final: bool
) -> bytes:
    """The entry a full object gets in the merged pack: a delta against its previous version when that
    is in the pack; else, while a later merge may find that version, as it was (compressed fast if it was
    not); else compressed."""
    code, _, length, _ = parse_header(entry)
    base, stored = pack.hints.get(oid), oid in pack.raw
    keep = False
    if base is not None and base not in merge.offsets and not final:
        merged.hints[oid], keep = base, True
        if not stored:
            return entry
    data = merge.bodies.get(oid) or zlib.decompress(entry[length:])
    if keep:  # until a later merge holds its previous version: compressed fast
        return entry_header(code, len(data)) + zlib.compress(data, 1)
    if base is not None and base in merge.offsets:
        delta = merge.delta_entry(oid, code, data, base, height)
        if delta is not None:
            return delta
    return entry_header(code, len(data)) + zlib.compress(data, LEVEL) if stored else entry


class PackStack:
    """The packs this process wrote, merged ``fan`` at a time per level (an LSM-style counter) by a
    background thread, so that a commit never waits for a merge (a level-3 merge rewrites ~50 MB).

    The thread only reads, writes and deletes pack files; it never touches libgit2. A merged pack is
    complete on disk before the packs it replaces are deleted, so every object is always in some pack.
    """

    def __init__(self, folder: Path, fan: int = 8, reopen_after: int = 64, fsync: bool = True) -> None:
        self.folder = folder
        self.fsync = fsync
        self.fan = fan
        self.reopen_after = reopen_after
        self._packs: list[_Pack] = []
        self._busy: set[int] = set()
        self._removed = 0
        self._closing = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._bodies = Bodies()

    def push(self, stem: Path, entries: _Entries | None = None) -> bool:
        """Register a new level-0 pack. True when ``reopen_after`` packs were merged away since the last
        True: libgit2 never forgets a pack it has seen (a lookup miss searches them all), so the caller
        should then reopen its repository."""
        size = (
            sum(len(e) for _, e in entries.items.values())
            if entries
            else stem.with_suffix(".pack").stat().st_size
        )
        hints = dict(entries.hints) if entries else {}
        raw = set(entries.raw) if entries else set()
        with self._wake:
            self._packs.append(_Pack(stem, 0, size, entries, hints, raw))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="croqq-pack-merge", daemon=True)
                self._thread.start()
            self._wake.notify()
            if self._removed < self.reopen_after:
                return False
            self._removed = 0
            return True

    def close(self, compact: bool = True) -> None:
        """Finish the merges that are due, stop the thread, then (``compact``) merge every pack left
        into one."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        live = sorted(
            (p for p in self._packs if p.level >= 0), key=lambda p: -p.level
        )  # stable: oldest first within a level, and a higher level holds older commits
        if (
            compact
            and (len(live) > 1 or any(p.raw for p in live))
            and sum(p.size for p in live) <= MAX_PACK_BYTES
        ):
            merged = self._merge(live, final=True)
            if merged is not None:
                self._packs = [p for p in self._packs if p.level < 0] + [merged]

    def _due(self) -> list[_Pack] | None:
        """The packs of the lowest full level that is not being merged (call with the lock held)."""
        for level in sorted({p.level for p in self._packs} - self._busy - {-1}):
            same = [p for p in self._packs if p.level == level]
            if len(same) >= self.fan and sum(p.size for p in same[: self.fan]) <= MAX_PACK_BYTES:
                return same[: self.fan]
        return None

    def _run(self) -> None:
        while True:
            with self._wake:
                batch = self._due()
                while batch is None and not self._closing:
                    self._wake.wait()
                    batch = self._due()
                if batch is None:
                    return
                self._busy.add(batch[0].level)
            merged = self._merge(batch)
            with self._wake:
                self._busy.discard(batch[0].level)
                kept = [p for p in self._packs if all(p is not b for b in batch)]
                if merged is None:  # leave them to git gc, never retry
                    for pack in batch:
                        pack.level = -1
                    continue
                self._packs = [*kept, merged]
                self._removed += len(batch)

    def _merge(self, packs: list[_Pack], final: bool = False) -> _Pack | None:
        try:
            merged = merge_packs(packs, self.folder, self.fsync, self._bodies, final)
            for pack in packs:
                if pack.stem != merged.stem:
                    pack.stem.with_suffix(".idx").unlink(missing_ok=True)
                    pack.stem.with_suffix(".pack").unlink(missing_ok=True)
        except Exception as exc:  # a merge only saves space: whatever goes wrong, the packs stay as they are
            log.warning("pack merge skipped: %s", exc, exc_info=not isinstance(exc, OSError))
            return None
        log.debug("merged %d packs into %s", len(packs), merged.stem.name)
        return merged
