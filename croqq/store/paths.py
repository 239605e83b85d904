"""Every path inside the results repo, built in one place (all repo-relative, POSIX separators).

tuning/<gpu>/<dsl>/state.json
tuning/<gpu>/<dsl>/submissions.jsonl
tuning/<gpu>/<dsl>/compaction-summary.md
tuning/<gpu>/<dsl>/shapes/<key>/checkpoint.json
tuning/<gpu>/<dsl>/shapes/<key>/results.tsv
tuning/<gpu>/<dsl>/shapes/<key>/attempts.jsonl
tuning/<gpu>/<dsl>/shapes/<key>/rounds.raw.jsonl
tuning/<gpu>/<dsl>/shapes/<key>/rounds.md
tuning/<gpu>/<dsl>/shapes/<key>/ideas.jsonl
tuning/<gpu>/<dsl>/shapes/<key>/srcs/iter<NNN>_<tag>.<ext>
tuning/<gpu>/<dsl>/shapes/<key>/perf/timing_iter<NNN>.txt
tuning/<gpu>/<dsl>/shapes/<key>/perf/profile_iter<NNN>.txt
tuning/<gpu>/<dsl>/headers/<hash16>/<name>          (once per distinct header content)
tuning/<gpu>/<dsl>/imported/<name>.json              (an imported log kept as read-only history)
kernels/<family>_<dtype>/<key>_best.<ext>

One folder per shape: a STORE changes files of one shape only, so a commit rewrites one wide tree
(``shapes/``, one entry per shape) whatever the number of shapes, not one per kind of record.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

TUNING = "tuning"
KERNELS = "kernels"


def iter_name(iteration: int) -> str:
    return f"iter{iteration:03d}"


@dataclass(frozen=True)
class RunPaths:
    """Paths of one (gpu type, dsl) run."""

    gpu: str
    dsl: str

    @property
    def root(self) -> str:
        return f"{TUNING}/{self.gpu}/{self.dsl}"

    @property
    def state_json(self) -> str:
        return f"{self.root}/state.json"

    @property
    def submissions(self) -> str:
        return f"{self.root}/submissions.jsonl"

    @property
    def summary_md(self) -> str:
        return f"{self.root}/compaction-summary.md"

    def results_tsv(self, key: str) -> str:
        return f"{self.shape_dir(key)}/results.tsv"

    def attempts(self, key: str) -> str:
        return f"{self.shape_dir(key)}/attempts.jsonl"

    def checkpoint(self, key: str) -> str:
        return f"{self.shape_dir(key)}/checkpoint.json"

    @property
    def shapes_dir(self) -> str:
        """The folder of every shape's folder (its names are the keys)."""
        return f"{self.root}/shapes"

    @property
    def imported_dir(self) -> str:
        """Imported logs kept as read-only history (``croqq import``), one JSON file each."""
        return f"{self.root}/imported"

    def imported(self, name: str) -> str:
        return f"{self.imported_dir}/{name}.json"

    def shape_dir(self, key: str) -> str:
        return f"{self.shapes_dir}/{key}"

    def rounds_raw(self, key: str) -> str:
        return f"{self.shape_dir(key)}/rounds.raw.jsonl"

    def rounds_md(self, key: str) -> str:
        return f"{self.shape_dir(key)}/rounds.md"

    def ideas(self, key: str) -> str:
        return f"{self.shape_dir(key)}/ideas.jsonl"

    def src(self, key: str, iteration: int, tag: str, ext: str) -> str:
        return f"{self.srcs_dir(key)}/{iter_name(iteration)}_{tag}.{ext}"

    def srcs_dir(self, key: str) -> str:
        return f"{self.shape_dir(key)}/srcs"

    def timing(self, key: str, iteration: int) -> str:
        return f"{self.perf_dir(key)}/timing_{iter_name(iteration)}.txt"

    def profile(self, key: str, iteration: int) -> str:
        return f"{self.perf_dir(key)}/profile_{iter_name(iteration)}.txt"

    def perf_dir(self, key: str) -> str:
        return f"{self.shape_dir(key)}/perf"

    def shape_files(self, key: str) -> list[str]:
        """Every file and folder that holds one shape's state (what `croqq clean` resets)."""
        return [self.shape_dir(key)]


def best_kernel(family: str, dtype: str, key: str, ext: str) -> str:
    return f"{KERNELS}/{family}_{dtype}/{key}_best.{ext}"


def is_inside_repo(path: str) -> bool:
    """True for a relative path that stays inside the repo once normalized."""
    if not path or path.startswith("/") or "\\" in path:
        return False
    norm = posixpath.normpath(path)
    return norm != ".." and not norm.startswith("../")
