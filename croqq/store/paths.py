"""Every path inside the results repo, built in one place (all repo-relative, POSIX separators).

tuning/<gpu>/<dsl>/state.json
tuning/<gpu>/<dsl>/submissions.jsonl
tuning/<gpu>/<dsl>/compaction-summary.md
tuning/<gpu>/<dsl>/logs/<key>/results.tsv
tuning/<gpu>/<dsl>/logs/<key>/attempts.jsonl
tuning/<gpu>/<dsl>/checkpoints/<key>.json
tuning/<gpu>/<dsl>/memory/<key>/rounds.raw.jsonl
tuning/<gpu>/<dsl>/memory/<key>/rounds.md
tuning/<gpu>/<dsl>/memory/<key>/ideas.jsonl
tuning/<gpu>/<dsl>/srcs/<key>/iter<NNN>_<tag>.<ext>
tuning/<gpu>/<dsl>/headers/<hash16>/<name>          (once per distinct header content)
tuning/<gpu>/<dsl>/perf/<key>/timing_iter<NNN>.txt
tuning/<gpu>/<dsl>/perf/<key>/profile_iter<NNN>.txt
kernels/<family>_<dtype>/<key>_best.<ext>
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
        return f"{self.root}/logs/{key}/results.tsv"

    def attempts(self, key: str) -> str:
        return f"{self.root}/logs/{key}/attempts.jsonl"

    def checkpoint(self, key: str) -> str:
        return f"{self.root}/checkpoints/{key}.json"

    @property
    def checkpoints_dir(self) -> str:
        return f"{self.root}/checkpoints"

    def rounds_raw(self, key: str) -> str:
        return f"{self.root}/memory/{key}/rounds.raw.jsonl"

    def rounds_md(self, key: str) -> str:
        return f"{self.root}/memory/{key}/rounds.md"

    def ideas(self, key: str) -> str:
        return f"{self.root}/memory/{key}/ideas.jsonl"

    def src(self, key: str, iteration: int, tag: str, ext: str) -> str:
        return f"{self.root}/srcs/{key}/{iter_name(iteration)}_{tag}.{ext}"

    def srcs_dir(self, key: str) -> str:
        return f"{self.root}/srcs/{key}"

    def timing(self, key: str, iteration: int) -> str:
        return f"{self.root}/perf/{key}/timing_{iter_name(iteration)}.txt"

    def profile(self, key: str, iteration: int) -> str:
        return f"{self.root}/perf/{key}/profile_{iter_name(iteration)}.txt"

    def perf_dir(self, key: str) -> str:
        return f"{self.root}/perf/{key}"

    def shape_files(self, key: str) -> list[str]:
        """Every file and folder that holds one shape's state (what `croqq clean` resets)."""
        return [
            f"{self.root}/logs/{key}",
            self.checkpoint(key),
            f"{self.root}/memory/{key}",
            self.srcs_dir(key),
            self.perf_dir(key),
        ]


def best_kernel(family: str, dtype: str, key: str, ext: str) -> str:
    return f"{KERNELS}/{family}_{dtype}/{key}_best.{ext}"


def is_inside_repo(path: str) -> bool:
    """True for a relative path that stays inside the repo once normalized."""
    if not path or path.startswith("/") or "\\" in path:
        return False
    norm = posixpath.normpath(path)
    return norm != ".." and not norm.startswith("../")
