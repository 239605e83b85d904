"""The pygit2 internals the store patches through (``gitrepo._index_add``, ``gitrepo._libgit2_fsync``) are
pinned: outside the versions they were checked on, or without them, this fails and says what to re-check."""

from __future__ import annotations

import pygit2

from croqq.store.gitrepo import LIBGIT2_CHECKED, PYGIT2_CHECKED

RECHECK = (
    "re-check croqq/store/gitrepo.py _index_add (IndexEntry._to_c, git_index_entry's stat fields, "
    "C.git_index_add, Index._index, errors.check_error) and _libgit2_fsync (GIT_OPT_ENABLE_FSYNC_GITDIR) "
    "against this pygit2, then add its version to PYGIT2_CHECKED / LIBGIT2_CHECKED"
)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_installed_pygit2_is_a_checked_version() -> None:
    assert _minor(pygit2.__version__) in PYGIT2_CHECKED, f"pygit2 {pygit2.__version__}: {RECHECK}"
    assert _minor(pygit2.LIBGIT2_VERSION) in LIBGIT2_CHECKED, f"libgit2 {pygit2.LIBGIT2_VERSION}: {RECHECK}"


def test_the_internals_the_store_uses_are_there() -> None:
    from pygit2.errors import check_error
    from pygit2.ffi import C

    assert callable(check_error), RECHECK
    assert hasattr(C, "git_index_add"), RECHECK
    assert hasattr(pygit2, "GIT_OPT_ENABLE_FSYNC_GITDIR"), RECHECK
    assert "_index" in dir(pygit2.Index) or hasattr(pygit2.Index(), "_index"), RECHECK
    entry = pygit2.IndexEntry("a.txt", pygit2.Oid(hex="0" * 40), pygit2.enums.FileMode.BLOB)
    centry, _keep = entry._to_c()
    for field in ("dev", "ino", "uid", "gid", "file_size"):
        assert hasattr(centry, field), f"git_index_entry.{field}: {RECHECK}"
    for stamp in (centry.ctime, centry.mtime):
        assert hasattr(stamp, "seconds") and hasattr(stamp, "nanoseconds"), RECHECK
