"""Is the results repo intact? A check cheap enough to run at every writer start-up and every minute.

What it reads, all from disk through a fresh libgit2 handle (never the writer's caches):

- every ref (loose files and ``packed-refs``): it must parse and point at an object that exists; the
  branch must point at a commit whose commit and root tree objects read back with their ids (libgit2
  verifies an object's hash on every read);
- every pack: its trailing checksum (the hash of the whole ``.pack``) and its ``.idx``'s two checksums.
  This finds any flipped byte in a pack at hashing speed, without inflating an object; a pack that fails
  is then read entry by entry against the CRC32 that its index keeps, to name the damaged object;
- every loose object: inflated and hashed against its file name.

Packs and loose objects are immutable files named by content, so :class:`RepoCheck` verifies each once
and then only what is new (git's repacks and the writer's commits add packs). Each run also earns
``recheck_bytes`` of credit to verify the files checked longest ago again, a whole file at a time once the
credit covers it, so bit rot in an old pack is found too, at a bounded average cost per run.
:class:`RepoGuard` holds the writer's verdict: the writer commits nothing while damage stands.

Reachability of the whole history (``git fsck``) is not part of it: that costs a walk of every commit
and tree; ``croqq repo check`` runs it on demand.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pygit2

from croqq.errors import RepoCorruptError

log = logging.getLogger(__name__)

HINT = "see `croqq repo repair`"
RECHECK_BYTES = 16 << 20  # bytes of older files verified again per run, on average
_HEX = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Damage:
    """One damaged file or ref: ``line`` says what, in one line; ``path``: the file (None for a ref that
    points at a missing object)."""

    line: str
    path: Path | None = None


def _line(what: str) -> str:
    return f"results repo corrupt: {what}; {HINT}"


def _digest(path: Path, size: int, algo: str) -> tuple[bytes, bytes]:
    """(hash of the first ``size`` bytes, the bytes after them)."""
    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        left = size
        while left > 0:
            chunk = fh.read(min(_CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
        return h.digest(), fh.read()


def _idx_entries(idx: bytes, hlen: int) -> list[tuple[int, bytes, int]]:
    """(offset, object id, crc32) of every object of a version-2 pack index, by offset."""
    count = struct.unpack(">I", idx[8 + 255 * 4 : 8 + 256 * 4])[0]
    names_at = 8 + 256 * 4
    crcs_at = names_at + count * hlen
    offs_at = crcs_at + count * 4
    large_at = offs_at + count * 4
    out = []
    for i in range(count):
        oid = idx[names_at + i * hlen : names_at + (i + 1) * hlen]
        crc = struct.unpack(">I", idx[crcs_at + i * 4 : crcs_at + i * 4 + 4])[0]
        off = struct.unpack(">I", idx[offs_at + i * 4 : offs_at + i * 4 + 4])[0]
        if off & 0x80000000:
            j = off & 0x7FFFFFFF
            off = struct.unpack(">Q", idx[large_at + j * 8 : large_at + j * 8 + 8])[0]
        out.append((off, oid, crc))
    return sorted(out)


def _bad_pack_objects(pack: Path, idx: bytes, hlen: int) -> list[str]:
    """Ids of the objects whose bytes in ``pack`` no longer match their CRC32 in the index."""
    data = pack.read_bytes()
    entries = _idx_entries(idx, hlen)
    ends = [off for off, _, _ in entries[1:]] + [len(data) - hlen]
    pairs = zip(entries, ends, strict=True)
    return [oid.hex() for (off, oid, crc), end in pairs if zlib.crc32(data[off:end]) != crc]


def verify_pack(pack: Path, hlen: int = 20) -> Damage | None:
    """Damage of one pack and its index (None: both checksums hold)."""
    algo = "sha1" if hlen == 20 else "sha256"
    idx_path = pack.with_suffix(".idx")
    name = f"objects/pack/{pack.name}"
    try:
        idx = idx_path.read_bytes()
        pack_sum, pack_tail = _digest(pack, pack.stat().st_size - hlen, algo)
    except FileNotFoundError:
        return None  # a repack replaced it meanwhile: its objects are in the new pack
    if len(idx) < 8 + 256 * 4 + 2 * hlen or hashlib.new(algo, idx[:-hlen]).digest() != idx[-hlen:]:
        return Damage(_line(f"index objects/pack/{idx_path.name} fails its checksum"), idx_path)
    if pack_sum != pack_tail or idx[-2 * hlen : -hlen] != pack_tail:
        try:
            bad = _bad_pack_objects(pack, idx, hlen)
        except (struct.error, ValueError, OSError):
            bad = []
        what = f"object {bad[0]} in {name} unreadable" if bad else f"{name} fails its checksum"
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return Damage(_line(what + more), pack)
    return None


def verify_loose(path: Path, hlen: int = 20) -> Damage | None:
    """Damage of one loose object: it must inflate to ``<type> <size>\\0<body>`` hashing to its name."""
    oid = path.parent.name + path.name
    algo = "sha1" if hlen == 20 else "sha256"
    try:
        raw = zlib.decompress(path.read_bytes())
    except FileNotFoundError:
        return None  # packed and pruned meanwhile
    except zlib.error:
        return Damage(_line(f"loose object {oid} unreadable (bad zlib data)"), path)
    header, _, body = raw.partition(b"\0")
    kind, _, size = header.partition(b" ")
    if kind not in (b"blob", b"tree", b"commit", b"tag") or size != str(len(body)).encode():
        return Damage(_line(f"loose object {oid} unreadable (bad header)"), path)
    if hashlib.new(algo, raw).hexdigest() != oid:
        return Damage(_line(f"loose object {oid} unreadable (hash mismatch)"), path)
    return None


def _refs(gitdir: Path) -> Iterator[tuple[str, str, Path]]:
    """(ref name, its raw value, the file holding it) of every loose and packed ref."""
    packed = gitdir / "packed-refs"
    if packed.exists():
        for line in packed.read_text(errors="replace").splitlines():
            if line and line[0] not in "#^":
                value, _, name = line.partition(" ")
                yield name, value, packed
    for folder, _, files in os.walk(gitdir / "refs"):
        for file in files:
            path = Path(folder) / file
            if not file.endswith(".lock"):
                yield path.relative_to(gitdir).as_posix(), path.read_text(errors="replace").strip(), path


def check_refs(repo: pygit2.Repository, branch: str) -> list[Damage]:
    """Every ref parses and points at an existing object; the branch at a readable commit and tree."""
    gitdir = Path(repo.path)
    damage = []
    seen = False
    for name, value, path in _refs(gitdir):
        if value.startswith("ref: "):
            continue
        if not _HEX.match(value):
            damage.append(Damage(_line(f"ref {name} unreadable (holds {value[:16]!r})"), path))
        elif value not in repo.odb:
            damage.append(Damage(_line(f"ref {name} points at missing object {value}"), path))
        elif name == f"refs/heads/{branch}":
            seen = True
            problem = _tip_problem(repo, value)
            if problem:
                damage.append(Damage(_line(f"ref {name}: {problem}")))
    if not seen and not damage and (gitdir / "refs" / "heads").is_dir() and _has_objects(gitdir):
        damage.append(Damage(_line(f"ref refs/heads/{branch} is missing")))
    return damage


def _has_objects(gitdir: Path) -> bool:
    """A repo with objects had a branch (the writer's first commit creates both)."""
    packs = gitdir / "objects" / "pack"
    return any(packs.glob("*.pack")) or any(
        p.is_dir() and len(p.name) == 2 for p in (gitdir / "objects").iterdir()
    )


def _tip_problem(repo: pygit2.Repository, value: str) -> str:
    try:
        commit = repo[value]
        if not isinstance(commit, pygit2.Commit):
            return f"{value} is a {type(commit).__name__.lower()}, not a commit"
        tree = repo[commit.tree_id]
        len(tree)
    except (KeyError, pygit2.GitError, ValueError) as exc:
        return f"tip {value} or its tree unreadable ({exc})"
    return ""


def _hash_len(repo: pygit2.Repository) -> int:
    try:
        return 32 if repo.config["extensions.objectformat"] == "sha256" else 20
    except KeyError:
        return 20


class RepoCheck:
    """The incremental check of one repo (see the module docstring); :meth:`run` returns the damage
    found (empty: intact)."""

    def __init__(self, path: Path, branch: str = "main", recheck_bytes: int = RECHECK_BYTES) -> None:
        self.path = Path(path)
        self.branch = branch
        self.recheck_bytes = recheck_bytes
        self._verified: OrderedDict[Path, int] = OrderedDict()  # file -> size, oldest check first
        self._credit = 0  # bytes of re-verification earned (recheck_bytes per run), spent a file at a time

    def run(self) -> list[Damage]:
        if not (self.path / ".git").exists() and not (self.path / "HEAD").exists():
            return []  # no repo yet: the writer creates it
        try:
            repo = pygit2.Repository(str(self.path), flags=pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        except pygit2.GitError as exc:
            return [Damage(_line(f"{self.path} does not open as a git repo ({exc})"))]
        try:
            damage = self._objects(Path(repo.path) / "objects", _hash_len(repo))
            damage += check_refs(repo, self.branch)
        finally:
            repo.free()
        return damage

    def _objects(self, objects: Path, hlen: int) -> list[Damage]:
        files = dict(_object_files(objects))
        for gone in [p for p in self._verified if p not in files]:
            del self._verified[gone]
        todo = [p for p in files if p not in self._verified]
        self._credit = min(self._credit + self.recheck_bytes, sum(self._verified.values()))
        for old, size in list(self._verified.items()):  # oldest first, while the credit covers them
            if size > self._credit:
                break
            todo.append(old)
            self._credit -= size
        damage = []
        for path in todo:
            found = verify_pack(path, hlen) if path.suffix == ".pack" else verify_loose(path, hlen)
            self._verified.pop(path, None)
            if found is not None:
                damage.append(found)
            elif path.exists():
                self._verified[path] = files[path]  # to the end of the line
        return damage


def _object_files(objects: Path) -> Iterator[tuple[Path, int]]:
    """(file, size) of every pack with an index (a pack without one is being written) and every loose
    object; a file that a repack removes meanwhile is left out."""
    packs = [p for p in (objects / "pack").glob("pack-*.pack") if p.with_suffix(".idx").exists()]
    loose = [p for d in objects.glob("[0-9a-f][0-9a-f]") for p in _listing(d) if not p.name.startswith("tmp")]
    for path in packs + loose:
        try:
            yield path, path.stat().st_size
        except FileNotFoundError:
            continue


class RepoGuard:
    """The writer's standing verdict on its repo, from the last :class:`RepoCheck` and from any read that
    failed on a damaged object (:meth:`found`). While damage stands, :meth:`require` refuses
    (:class:`RepoCorruptError`), checking again at most every ``recheck_s``; ``on_change(line or None)``
    hears each change of verdict (the writer's process raises or clears its alarm there)."""

    def __init__(
        self,
        check: RepoCheck,
        on_change: Callable[[str | None], None] | None = None,
        recheck_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._check = check
        self.on_change = on_change
        self.recheck_s = recheck_s
        self._clock = clock
        self.problem: str | None = None
        self._checked_at: float | None = None
        self._known = False  # no verdict given yet

    def check(self) -> str | None:
        """Run the check now; the first damage's line, or None when the repo is intact."""
        damage = self._check.run()
        self._checked_at = self._clock()
        for found in damage[1:]:
            log.error("%s", found.line)
        self._set(damage[0].line if damage else None)
        return self.problem

    def found(self, line: str) -> None:
        """A read failed on a damaged object: refuse until a check passes."""
        self._checked_at = self._clock()
        self._set(line)

    def require(self) -> None:
        """Return when the repo may be committed to; else raise RepoCorruptError (the line)."""
        due = self._checked_at is None or (
            self.problem is not None and self._clock() - self._checked_at >= self.recheck_s
        )
        if due:
            self.check()
        if self.problem is not None:
            raise RepoCorruptError(self.problem)

    def _set(self, problem: str | None) -> None:
        """Record the verdict; ``on_change`` hears the first one (an alarm a previous process left is
        cleared) and every change."""
        known, before = self._known, self.problem
        self._known = True
        if known and problem == before:
            return
        if problem is not None and problem != before:
            log.error("%s; the writer commits nothing until it is repaired", problem)
        elif problem is None and before is not None:
            log.warning("results repo %s is intact again; the writer resumes", self._check.path)
        self.problem = problem
        if self.on_change is not None:
            self.on_change(problem)


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except FileNotFoundError:  # emptied and removed by git's prune-packed meanwhile
        return []
