"""One branch of the results repo through plumbing: commits whose cost does not grow with the repo.

pygit2 (libgit2, in process) serves the hot path, reads and commits, where a subprocess per call would
cost more than the commit; the ``git`` executable serves porcelain that libgit2 lacks (push, repack, fsck).

A commit writes only the changed blobs and the trees on their paths, as one small pack
(``croqq.store._objects``), fsynced, then moves the branch compare-and-swap (a foreign move raises
:class:`RetryableError`) and fsyncs the ref, so it returns only once it survives a power loss; a kill
before the move leaves an unreferenced pack and the branch untouched. A full disk (below
``reserve_bytes`` free before a commit, or ENOSPC during one) raises :class:`~croqq.errors.DiskFullError`
with nothing half-written: no partial file, the branch where it was. Lock files a killed predecessor
provably left are removed at start-up (``croqq.store._locks``). Reads come from the branch tip, with the
tip's folders and recent blobs mirrored in memory. The working tree and index (``sync_worktree``) follow
the branch in batches, every ``index_flush_s`` and at close, because libgit2 rewrites the whole index on
each write; on open they are repaired up to the tip. Repacking is git's own (``croqq.store._repack``),
in the background; the handle is reopened after each repack so it does not keep deleted packs open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pygit2

from croqq import diskspace
from croqq.errors import ConfigError, InvalidRecordError, RepoCorruptError, RetryableError
from croqq.store._fsync import fsync_path
from croqq.store._locks import LockJournal
from croqq.store._objects import TREE, Entry, LibgitSink, Node, PackSink, Sink, Staged, Trees
from croqq.store._repack import REPACK_EVERY, Repacker
from croqq.store.integrity import HINT

log = logging.getLogger(__name__)

AUTHOR_NAME = "croqq writer"
AUTHOR_EMAIL = "croqq@localhost"
TMP_SUFFIX = ".croqq-tmp"
PUSH_TIMEOUT_S = 120.0
BLOB_CACHE_BYTES = 64 << 20
# pygit2's cffi internals that _index_add and _libgit2_fsync use were checked on these versions
# (major.minor); tests/unit/test_store_pygit2_pin.py fails outside them.
PYGIT2_CHECKED = ("1.21",)
LIBGIT2_CHECKED = ("1.9",)
Changes = dict[str, bytes | None]


def blob_id_of(data: bytes) -> str:
    """The id git gives a blob with these bytes (nothing is written)."""
    return str(pygit2.hash(data))


def check_path(path: str) -> list[str]:
    """The path's components; refuse anything that is not a plain repo-relative path."""
    parts = path.split("/")
    bad = not path or path.startswith("/") or "\\" in path
    if bad or any(p in ("", ".", "..", ".git") for p in parts):
        raise InvalidRecordError(f"{path!r}: not a plain repo-relative path")
    return parts


def _nest(changes: Changes) -> Node:
    root = Node()
    for path, data in changes.items():
        node = root
        for part in check_path(path):
            node = node.children.setdefault(part, Node())
        node.data = data
    return root


def _index_add(index: pygit2.Index, path: str, oid: pygit2.Oid, full: Path) -> None:
    """Add a known blob to the index with the file's stat data (what ``git status`` compares) without
    hashing the file or touching the object database (``Index.add(path)`` does both). It fills libgit2's
    entry through pygit2's cffi layer, as ``Index.add`` itself does; if that layer is not there, the
    entry goes in without stat data (``git status`` then re-reads those files once)."""
    entry = pygit2.IndexEntry(path, oid, pygit2.enums.FileMode.BLOB)
    try:
        from pygit2.errors import check_error
        from pygit2.ffi import C

        st = os.stat(full)
        centry, keep = entry._to_c()
        centry.ctime.seconds, centry.ctime.nanoseconds = divmod(st.st_ctime_ns, 1_000_000_000)
        centry.mtime.seconds, centry.mtime.nanoseconds = divmod(st.st_mtime_ns, 1_000_000_000)
        centry.dev, centry.ino = st.st_dev & 0xFFFFFFFF, st.st_ino & 0xFFFFFFFF
        centry.uid, centry.gid, centry.file_size = st.st_uid, st.st_gid, st.st_size & 0xFFFFFFFF
        check_error(C.git_index_add(index._index, centry))
        del keep
    except (ImportError, AttributeError, TypeError) as exc:
        log.debug("index entry without stat data for %s (%s)", path, exc)
        index.add(entry)


def _libgit2_fsync(on: bool) -> None:
    """libgit2's process-wide switch to fsync the files it writes and their folders; a repository's
    reference store reads it when the repository is opened, so it is set before every open."""
    option = getattr(pygit2, "GIT_OPT_ENABLE_FSYNC_GITDIR", None)
    if option is not None:
        pygit2.option(option, on)


def _commit_body(tree: pygit2.Oid, parent: pygit2.Oid | None, message: str) -> bytes:
    """A commit object's body, authored and committed by the writer now (UTC)."""
    stamp = f"{AUTHOR_NAME} <{AUTHOR_EMAIL}> {int(time.time())} +0000"
    lines = [f"tree {tree}"] + ([f"parent {parent}"] if parent is not None else [])
    lines += [f"author {stamp}", f"committer {stamp}", "", message]
    return "\n".join(lines).encode()


class GitRepo:
    """One branch of a git repo: cached tip, path reads, plumbing commits with a CAS ref move."""

    def __init__(
        self,
        path: Path,
        branch: str = "main",
        sync_worktree: bool = True,
        *,
        create: bool = True,
        index_flush_s: float = 1.0,
        fsync: bool = True,
        owner: str | None = None,
        previous_gone: Callable[[str], bool] | None = None,
        repack_every: int = REPACK_EVERY,
        reserve_bytes: int = 0,
        retry_s: float = 5.0,
    ) -> None:
        """``fsync``: make each commit durable before it returns (see the module docstring).
        ``repack_every``: commits between background repacks (0: only at close).
        ``owner``: the writer's lease owner token, given only by a lease holder; it records the locks
        this object takes and deletes the one a killed previous writer left when ``previous_gone(its
        owner)`` says that writer's lease is no longer held (``croqq.store._locks``).
        ``reserve_bytes``: no commit starts with less free on the repo's disk (DiskFullError instead,
        which says to retry in ``retry_s``). Opening on a full disk raises what the write raised
        (:func:`croqq.diskspace.guard` turns it into DiskFullError)."""
        self.path = Path(path)
        self.reserve_bytes = reserve_bytes
        self.retry_s = retry_s
        self.branch = branch
        self.refname = f"refs/heads/{branch}"
        self.index_flush_s = index_flush_s
        self.fsync = fsync
        self._repo = self._open(create)
        gitdir = Path(self._repo.path)
        self._journal = (
            LockJournal.claim(gitdir, owner, previous_gone or (lambda _: False), fsync) if owner else None
        )
        self._tip: pygit2.Oid | None = None
        self._trees = Trees(self._object, None)
        self._pack_folder = gitdir / "objects" / "pack" if self._packable() else None
        self._repack_every = repack_every
        self._repacker: Repacker | None = None  # started by the first commit: readers never repack
        self._repacks_seen = 0
        self._blobs: OrderedDict[pygit2.Oid, bytes] = OrderedDict()
        self._blob_bytes = 0
        self._pending: dict[str, tuple[str, pygit2.Oid | None, bytes | None]] = {}
        self._made: set[str] = set()
        self._last_flush = 0.0
        self._closed = False
        self._frozen = False
        self.on_damage: Callable[[str], None] | None = None  # hears each RepoCorruptError's line
        self.before_ref_move: Callable[[], None] | None = None
        self.after_commit: Callable[[], None] | None = None  # e.g. wake the pusher (never blocks)
        self._refresh()
        if self._tip is None and create:
            self._initial_commit()
        self.sync_worktree = sync_worktree and self._worktree_follows_branch()
        if self.sync_worktree:
            self._index = pygit2.Index(str(Path(self._repo.path) / "index"))
            self._exclude_tmp_files()
            self._repair_worktree()

    @classmethod
    def open_existing(cls, path: Path, branch: str = "main") -> GitRepo:
        """Open for reading only: never creates a repo or a commit, never touches the working tree."""
        return cls(path, branch, sync_worktree=False, create=False)

    # -- opening ------------------------------------------------------------------------------------

    def _disk(self) -> contextlib.AbstractContextManager[None]:
        """Around writes to the repo: a full disk raises DiskFullError."""
        return diskspace.guard(self.path, "the results repo", self.retry_s)

    def _open(self, create: bool) -> pygit2.Repository:
        _libgit2_fsync(self.fsync)
        try:  # NO_SEARCH: never pick up an enclosing repo (the results repo may live inside a project)
            return pygit2.Repository(str(self.path), flags=pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        except pygit2.GitError as exc:
            if not create:
                raise ConfigError(f"{self.path}: not a git repository (the writer creates it)") from exc
        self.path.mkdir(parents=True, exist_ok=True)
        log.info("initializing results repo %s (branch %s)", self.path, self.branch)
        repo = pygit2.init_repository(str(self.path), bare=False, initial_head=self.branch)
        # No reflog for a repo only the writer commits to: each ref move would also append to
        # logs/refs/heads/<branch> (an extra file write per commit); `git log` is the audit trail.
        repo.config["core.logAllRefUpdates"] = False
        return repo

    def _packable(self) -> bool:
        """One pack per commit (see ``croqq.store._objects``) for a plain SHA-1 object store; anything
        else goes through libgit2's object database."""
        try:
            fmt = self._repo.config["extensions.objectformat"]
        except KeyError:
            fmt = "sha1"
        return fmt == "sha1" and (Path(self._repo.path) / "objects" / "pack").is_dir()

    def _sink(self) -> Sink:
        if self._pack_folder is not None:
            return PackSink(self._pack_folder, self.fsync)
        return LibgitSink(self._repo, self.fsync)

    def reopen(self) -> None:
        """Forget what libgit2 knew of the repo's files (after a repair put new packs or refs in place)."""
        self._reopen()
        self._refresh()

    def _reopen(self) -> None:
        """A fresh libgit2 handle (after a repack: forget, and close, the packs it deleted)."""
        self._repo.free()
        _libgit2_fsync(self.fsync)
        self._repo = pygit2.Repository(str(self.path), flags=pygit2.enums.RepositoryOpenFlag.NO_SEARCH)

    def _initial_commit(self) -> None:
        sink = self._sink()
        subject = "croqq: initialize results repo"
        oid = sink.add(b"commit", _commit_body(sink.add(b"tree", b""), None, subject + "\n"))
        sink.flush()
        self._move_ref(oid, None, subject)
        self._refresh()

    def _worktree_follows_branch(self) -> bool:
        if self._repo.is_bare:
            return False
        head = self._repo.references.get("HEAD")
        target = head.target if head is not None else None
        if target != self.refname:
            log.warning("%s: HEAD is %s, not %s; working tree left alone", self.path, target, self.refname)
            return False
        return True

    def _exclude_tmp_files(self) -> None:
        exclude = Path(self._repo.path) / "info" / "exclude"
        pattern = f"*{TMP_SUFFIX}"
        text = exclude.read_text() if exclude.exists() else ""
        if pattern not in text.split("\n"):
            exclude.parent.mkdir(parents=True, exist_ok=True)
            exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + pattern + "\n")

    # -- reading the tip ----------------------------------------------------------------------------

    def _ref_target(self) -> pygit2.Oid | None:
        try:
            ref = self._repo.references.get(self.refname)
            return ref.resolve().target if ref is not None else None  # type: ignore[return-value]
        except (pygit2.GitError, ValueError) as exc:
            raise self._damaged(f"ref {self.refname} unreadable ({exc})") from exc

    def _damaged(self, what: str) -> RepoCorruptError:
        """The error for a damaged object or ref (one line), told to ``on_damage`` first."""
        line = f"results repo corrupt: {what}; {HINT}"
        if self.on_damage is not None:
            self.on_damage(line)
        return RepoCorruptError(line)

    def freeze(self) -> GitRepo:
        """Pin every later read to the current tip: a consistent snapshot while a writer commits."""
        self._refresh()
        self._frozen = True
        return self

    def _refresh(self) -> None:
        if self._frozen:
            return
        target = self._ref_target()
        if target != self._tip:
            self._tip = target
            root = self._object(target).peel(pygit2.Commit).tree_id if target is not None else None
            self._trees = Trees(self._object, root)

    def _object(self, oid: pygit2.Oid) -> pygit2.Object:
        """An object by id. A miss reopens the repository once and retries: a repack deletes the packs
        it merged, which a libgit2 handle that listed them earlier cannot follow."""
        try:
            return self._repo[oid]
        except (KeyError, pygit2.GitError):
            self._reopen()
        try:
            return self._repo[oid]
        except KeyError as exc:
            raise self._damaged(f"object {oid} missing") from exc
        except pygit2.GitError as exc:
            raise self._damaged(f"object {oid} unreadable ({exc})") from exc

    def _entry(self, path: str) -> Entry | None:
        self._refresh()
        path = path.strip("/")
        if not path:
            return (TREE, self._trees.root) if self._trees.root is not None else None
        return self._trees.lookup(path)

    def _blob(self, oid: pygit2.Oid) -> bytes:
        data = self._blobs.get(oid)
        if data is None:
            data = self._object(oid).peel(pygit2.Blob).data
            self._remember(oid, data)
        else:
            self._blobs.move_to_end(oid)
        return data

    def _remember(self, oid: pygit2.Oid, data: bytes) -> None:
        """Keep recently written or read blobs (the files the writer appends to are read back next time)."""
        if oid in self._blobs or len(data) > BLOB_CACHE_BYTES // 8:
            return
        self._blobs[oid] = data
        self._blob_bytes += len(data)
        while self._blob_bytes > BLOB_CACHE_BYTES:
            _, old = self._blobs.popitem(last=False)
            self._blob_bytes -= len(old)

    def head(self) -> str | None:
        """The branch tip's commit id, None when the branch has no commit."""
        self._refresh()
        return str(self._tip) if self._tip is not None else None

    def read(self, path: str) -> bytes | None:
        """A file's bytes at the branch tip; None when missing (or a folder)."""
        entry = self._entry(path)
        return self._blob(entry[1]) if entry is not None and entry[0] != TREE else None

    def blob_id(self, path: str) -> str | None:
        """The blob id of a file at the tip (a cheap change detector for caches)."""
        entry = self._entry(path)
        return str(entry[1]) if entry is not None and entry[0] != TREE else None

    def exists(self, path: str) -> bool:
        return self._entry(path) is not None

    def is_dir(self, path: str) -> bool:
        entry = self._entry(path)
        return entry is not None and entry[0] == TREE

    def list_dir(self, path: str) -> list[str]:
        """Names in a folder at the tip, sorted; [] when it is missing or a file."""
        if not self.is_dir(path):
            return []
        folder = self._trees.folder(path.strip("/"))
        return sorted(folder.entries) if folder is not None else []

    # -- committing ---------------------------------------------------------------------------------

    def commit(self, changes: Changes, message: str) -> str:
        """Commit ``changes`` (path -> bytes, or None to delete a file or a folder) on top of the tip.

        Returns the new commit id (the unchanged tip when the changes change nothing). Raises
        RetryableError when the branch moved since this object last read it (a foreign writer) or the
        ref is locked; nothing is lost then but unreachable objects. Raises DiskFullError below the
        reserve (nothing written) or when a write runs out of space (no partial file, branch unmoved).
        """
        root = _nest(changes)
        diskspace.require(self.path, self.reserve_bytes, "the results repo", self.retry_s)
        base = self._tip
        current = self._ref_target()
        if current != base:
            self._refresh()
            raise RetryableError(
                f"{self.path}: branch {self.branch} moved from {base} to {current} under this writer "
                "(another writer?); re-read and retry"
            )
        with self._disk():  # a full disk: DiskFullError, with the branch where it was
            written = self._write(root, base, message)
        if written is None:
            return str(base)
        oid, staged, tree = written
        folders = {p for p, d in changes.items() if d is None and (self._trees.lookup(p) or (0,))[0] == TREE}
        self._tip = oid
        self._trees.merge(staged, tree)
        for blob, data in staged.blobs.items():
            self._remember(blob, data)
        self._after_repack()
        if self.sync_worktree:
            self._sync_files(changes, folders)
        if self.after_commit is not None:
            self.after_commit()
        return str(oid)

    def _write(
        self, root: Node, base: pygit2.Oid | None, message: str
    ) -> tuple[pygit2.Oid, Staged, pygit2.Oid] | None:
        """Write the commit's objects and move the branch onto it: (commit, staged trees, root tree), or
        None when the changes change nothing."""
        sink = self._sink()
        staged = self._trees.stage(root, sink)
        tree = staged.root or sink.add(b"tree", b"")
        if tree == self._trees.root:
            return None
        text = message if message.endswith("\n") else message + "\n"
        oid = sink.add(b"commit", _commit_body(tree, base, text))
        sink.flush()  # durable on return (fsync)
        if self.before_ref_move is not None:
            self.before_ref_move()  # a test hook: chaos tests kill the writer here
        self._move_ref(oid, base, text.split("\n", 1)[0])
        return oid, staged, tree

    def _after_repack(self) -> None:
        """Count the commit towards the next repack; reopen the handle when one finished since the last
        commit (the packs it deleted stay open, and take disk space, until libgit2 closes them)."""
        if self._repacker is None:
            self._repacker = Repacker(Path(self._repo.path), self._repack_every)
        self._repacker.poke()
        if self._repacker.done != self._repacks_seen:
            self._repacks_seen = self._repacker.done
            self._reopen()

    def _locked(self, lock: str) -> contextlib.AbstractContextManager[None]:
        """Around a libgit2 call that takes ``<gitdir>/<lock>``: recorded for the next writer's start-up."""
        return self._journal.taking(lock) if self._journal is not None else contextlib.nullcontext()

    def _move_ref(self, new: pygit2.Oid, old: pygit2.Oid | None, subject: str) -> None:
        """Compare-and-swap the branch from ``old`` to ``new`` (libgit2 checks the new commit exists: a
        handle that has not noticed the commit's new pack yet is reopened once), then make it durable."""
        for attempt in (1, 2):
            try:
                with self._locked(f"{self.refname}.lock"):
                    if old is None:
                        self._repo.references.create(self.refname, new, force=False)
                    else:
                        ref = self._repo.lookup_reference(self.refname)
                        if ref.target != old:
                            raise RetryableError(f"{self.path}: {self.refname} is no longer at {old}")
                        ref.set_target(new, f"commit: {subject}")
                break
            except (pygit2.GitError, ValueError, OSError) as exc:
                if attempt == 1 and self._ref_target() == old and new not in self._repo.odb:
                    self._reopen()
                    continue
                self._refresh()
                if diskspace.is_full(exc):
                    raise  # DiskFullError (commit's guard): the branch did not move
                raise RetryableError(f"{self.path}: could not move {self.refname} from {old}: {exc}") from exc
            except RetryableError:
                self._refresh()
                raise
        if self.fsync:
            self._sync_ref()

    def _sync_ref(self) -> None:
        """fsync the moved ref's file and folder (and its reflog, when the repo keeps one)."""
        ref = Path(self._repo.path) / self.refname
        try:
            fsync_path(ref)
            fsync_path(ref.parent)
            reflog = Path(self._repo.path) / "logs" / self.refname
            if reflog.exists():
                fsync_path(reflog)
        except OSError as exc:
            self._refresh()
            raise RetryableError(f"{self.path}: {self.refname} moved but may not be durable: {exc}") from exc

    # -- working tree and index ---------------------------------------------------------------------

    def _sync_files(self, changes: Changes, dirs: set[str]) -> None:
        """Queue the commit's files for the working tree; deletions happen now, writes at the next flush
        (coalesced: state.json and the appended logs are rewritten once per flush, not once per commit)."""
        for path, data in changes.items():
            if data is None:
                self._delete_file(path)
                self._queue(path, "rmdir" if path in dirs else "rm")
            else:
                entry = self._trees.lookup(path)
                self._queue(path, "add", entry[1] if entry is not None else None, data)
        if time.monotonic() - self._last_flush >= self.index_flush_s:
            self.sync_index()

    def _queue(self, path: str, op: str, oid: pygit2.Oid | None = None, data: bytes | None = None) -> None:
        if op == "rmdir":  # earlier ops inside a deleted folder are moot
            inside = [p for p in self._pending if p.startswith(path + "/")]
            for p in inside:
                del self._pending[p]
        self._pending.pop(path, None)  # re-insert at the end: the latest op on a path wins, in order
        self._pending[path] = (op, oid, data)

    def _write_file(self, path: str, data: bytes) -> None:
        full = os.path.join(self.path, path)
        folder, name = os.path.split(full)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        tmp = os.path.join(folder, f".{name}{TMP_SUFFIX}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
        except OSError:  # a full disk: no partial file is left behind
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        try:
            os.replace(tmp, full)
        except IsADirectoryError:
            shutil.rmtree(full)
            os.replace(tmp, full)

    def _delete_file(self, path: str) -> None:
        self._made.clear()
        full = self.path / path
        if full.is_dir() and not full.is_symlink():
            shutil.rmtree(full)
        elif full.exists() or full.is_symlink():
            full.unlink()
        parent = full.parent
        while parent != self.path and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    def sync_index(self) -> None:
        """Write the queued path updates into the index (one index write); a lock held by someone else
        (a concurrent ``git status``) postpones it to the next flush."""
        if not self.sync_worktree or not self._pending:
            return
        try:
            self._index.read(force=False)
            for path, (op, oid, data) in self._pending.items():
                full = self.path / path
                if op == "add" and data is not None:
                    self._write_file(path, data)
                if op == "add" and oid is not None and full.is_file():
                    _index_add(self._index, path, oid, full)
                elif op == "rmdir":
                    self._index.remove_directory(path)
                else:
                    with contextlib.suppress(OSError, KeyError):
                        self._index.remove(path)
            with self._locked("index.lock"):
                self._index.write()
        except (pygit2.GitError, OSError) as exc:
            log.warning("%s: index update postponed (%s)", self.path, exc)
            return
        self._pending.clear()
        self._last_flush = time.monotonic()

    def _repair_worktree(self) -> None:
        """Bring the index and working tree to the tip for every path where the index differs from it."""
        if self._trees.root is None:
            return
        index = self._repo.index
        index.read(force=False)
        diff = index.diff_to_tree(self._object(self._trees.root).peel(pygit2.Tree))
        paths = sorted({p for d in diff.deltas for p in (d.old_file.path, d.new_file.path) if p})
        for path in paths:
            entry = self._entry(path)
            if entry is None or entry[0] == TREE:
                self._delete_file(path)
                self._queue(path, "rm")
            else:
                self._write_file(path, self._blob(entry[1]))
                self._queue(path, "add", entry[1])
        if paths:
            log.info("%s: brought %d path(s) of working tree and index up to the tip", self.path, len(paths))
            self.sync_index()

    # -- maintenance --------------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """The bytes of every file of the git directory (objects, packs, refs, index): what the repo
        costs on disk, without the working tree."""
        total = 0
        for folder, _, files in os.walk(self._repo.path):
            for name in files:
                with contextlib.suppress(OSError):  # a pack repacked away meanwhile
                    total += os.lstat(os.path.join(folder, name)).st_size
        return total

    def push(self, remote: str) -> None:
        """Push the branch to ``remote`` (a name or URL) with the git CLI; never forces."""
        spec = f"{self.refname}:{self.refname}"
        cmd = ["git", "-C", str(self.path), "push", "--quiet", remote, spec]
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=PUSH_TIMEOUT_S, env=env, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RetryableError(f"git push {remote}: no answer after {PUSH_TIMEOUT_S:.0f}s") from exc
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            first = lines[0].strip() if lines else f"exit status {proc.returncode}"
            raise RetryableError(f"git push {remote} failed: {first}")

    def close(self) -> None:
        """Flush the index, run a last repack, release libgit2's handles. The repo is then clean for git
        log/fsck/status."""
        if self._closed:
            return
        self.sync_index()
        if self._repacker is not None:
            self._repacker.close()
        if self._journal is not None:
            self._journal.close()
        self._repo.free()
        self._closed = True

    def __enter__(self) -> GitRepo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
