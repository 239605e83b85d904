"""Find every results log of a CroqTile-style tree and read it with what belongs to it. Never writes.

Where a log sits says what it is (``tuning/`` may be SRC itself or any folder above the logs):

- ``<gpu>/<dsl>/logs/<key>/results.tsv`` (gen-1) or ``logs/<key>/<model>[/<model>]/results.tsv``: a main log;
  its checkpoint, memories, baseline and idea logs sit under ``<gpu>/<dsl>/{checkpoints,memory,baseline}/``
  at the same ``<key>[/<model>]``;
- side copies: ``.archive/<key>/logs/<model>/results.tsv`` (its own checkpoints/memory/baseline beside it),
  ``.backup/<key>_winners_<ts>/results.tsv``, a ``results.tsv`` under ``srcs/``, ``results.tsv.orig``.

A side copy is not read again when it duplicates a log of the same key (and model, when it names one)
already taken: same bytes, or every row it has is a row of that log (same id, decision, TFLOPS, kernel,
idea). It is then listed in that log's ``copies``. A side copy with rows no such log has is read as a log
of its own, kept as history when its key already has a log. Mains are taken before copies, copies in path
order. Nothing outside SRC is read: with a shape folder or a single file as SRC, the checkpoint, memories
and kernel sources that sit elsewhere in the tree are not looked up.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from croqq.errors import ConfigError
from croqq.store.importer.keys import parse_key
from croqq.store.importer.model import IdeaNote, ParsedKey, Problem, Row, SourceLog
from croqq.store.importer.sources import as_text
from croqq.store.importer.tsv import parse_results

LOG_NAMES = ("results.tsv", "results.tsv.orig")
IDEA_FILES = ("idea-log.jsonl", "attempt-log.jsonl", "rounds.raw.jsonl", "activity.jsonl")
_IDEA_TEXT = ("idea", "idea_summary", "summary", "hypothesis", "description", "title")
_BEST_KEYS = ("best_tflops", "current_best_tflops")
_REFERENCE_KEYS = ("tflops", "cublas_tflops", "tflops_cublas", "reference_tflops")
_KERNEL_SUFFIXES = frozenset({".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".py", ".co", ".ptx"})
_WINNERS = re.compile(r"_winners_.*$")


@dataclass
class _Place:
    """Where a log sits and where its companions are."""

    path: Path
    key: str
    model: str | None = None
    gpu: str | None = None
    dsl: str | None = None
    base: Path | None = None  # folder holding checkpoints/, memory/, baseline/
    under: str = ""  # the log's sub-path under those folders (``<key>/<model>``, ``<model>`` in .archive)
    copy: str | None = None  # the kind of side copy, None for a main log


def read_tree(src: Path, gpu: str | None = None) -> list[SourceLog]:
    """Every log under ``src`` (a tree, one shape folder or one results file), read and annotated.
    ``gpu`` (``--gpu``) is the GPU type the logs are imported for: it fills ``gpu`` where the path names
    none, and logs of several tree GPU folders then count as one shape. Raises ConfigError when ``src``
    is no tree."""
    src = src.resolve()
    root = src.parent if src.is_file() else src
    places = [_inside(_place(path), root) for path in _log_files(src)]
    places.sort(key=lambda p: (p.copy is not None, str(p.path)))
    taken: list[tuple[_Place, SourceLog]] = []
    for place in places:
        log = _read_log(place, root, gpu)
        same = [(p, other) for p, other in taken if _same_log(place, p)]
        duplicate = next((other for p, other in same if _duplicates(place, log, p, other)), None)
        if duplicate is not None:
            duplicate.copies.append(log.source)  # the model is frozen, its list is still being built
            continue
        if place.copy and same:
            log = log.model_copy(update={"imported_as": "history", "why": _copy_why(place, same)})
        taken.append((place, log))
    return _decide([log for _, log in taken], gpu)


def _log_files(src: Path) -> list[Path]:
    if not src.exists():
        raise ConfigError(f"{src}: no such file or folder to import")
    if src.is_file():
        if src.name not in LOG_NAMES:
            raise ConfigError(f"{src}: not a results.tsv nor a folder holding tuning logs")
        return [src]
    found = [
        Path(folder) / name
        for folder, _, names in os.walk(src)
        for name in names
        if name in LOG_NAMES and _plain_file(Path(folder) / name)
    ]
    if not found:
        raise ConfigError(f"{src}: no results.tsv under it; not a CroqTile tuning tree")
    return sorted(found)


def _place(path: Path) -> _Place:
    """Read a log's key, model, gpu and dsl from its path."""
    parts = path.parts
    folders = parts[:-1]
    copy = "orig" if path.name.endswith(".orig") else None
    if ".archive" in folders:
        at = folders.index(".archive")
        rest = list(folders[at + 2 :])
        model = "/".join(rest[1:]) if rest[:1] == ["logs"] and len(rest) > 1 else None
        gpu, dsl = _gpu_dsl(parts, at)
        base = Path(*parts[: at + 2])
        return _Place(path, parts[at + 1], model, gpu, dsl, base, model or "", "archive")
    if ".backup" in folders:
        at = folders.index(".backup")
        key = _WINNERS.sub("", folders[at + 1]) if len(folders) > at + 1 else folders[-1]
        return _Place(path, key, None, *_gpu_dsl(parts, at), Path(*parts[:at]), key, "backup")
    if "logs" in folders:
        at = len(folders) - 1 - folders[::-1].index("logs")
        rest = list(folders[at + 1 :])
        if "srcs" in rest:
            rest, copy = rest[: rest.index("srcs")], "srcs"
        if rest:
            model = "/".join(rest[1:]) or None
            base = Path(*parts[:at])
            return _Place(path, rest[0], model, *_gpu_dsl(parts, at), base, "/".join(rest), copy)
    if "srcs" in folders:
        at = folders.index("srcs")
        key = folders[at + 1] if len(folders) > at + 1 else folders[at - 1]
        return _Place(path, key, None, *_gpu_dsl(parts, at), Path(*parts[:at]), key, "srcs")
    return _Place(path, folders[-1], copy=copy)


def _inside(place: _Place, root: Path) -> _Place:
    """Companions are read inside SRC only: a shape folder or a single file brings its rows alone."""
    if place.base is not None and place.base != root and root not in place.base.parents:
        place.base = None
    return place


def _gpu_dsl(parts: tuple[str, ...], at: int) -> tuple[str | None, str | None]:
    """``tuning/<gpu>/<dsl>/`` right above ``parts[at]``, when the path has it."""
    if at >= 3 and parts[at - 3] == "tuning":
        return parts[at - 2], parts[at - 1]
    return None, None


def _read_log(place: _Place, root: Path, gpu: str | None) -> SourceLog:
    key = parse_key(place.key, place.model)
    problems: list[Problem] = []
    text = _text(place.path, root, problems)
    header, rows = "", list[Row]()
    if text is not None:
        hint = tuple(size for size in (key.m, key.n, key.k) if size is not None)
        header, rows, found = parse_results(text, hint)
        problems += found
    found_json = [
        (path, data)
        for path in _companions(place, "checkpoints")
        if path.suffix == ".json" and (data := _json(path, root, problems)) is not None
    ]
    checkpoint, checkpoint_source = _checkpoint(found_json, root)
    if checkpoint is not None:
        problems += _disagreement(checkpoint, checkpoint_source or "", rows)
    return SourceLog(
        source=_rel(place.path, root),
        key=key,
        gpu=place.gpu or gpu,
        dsl=place.dsl or _dsl_of(checkpoint),
        model=place.model,
        header=header,
        rows=rows,
        problems=problems,
        checkpoint=checkpoint,
        checkpoint_source=checkpoint_source,
        reference_tflops=_reference(rows, place, root, problems),
        ideas=_ideas(place, root, problems, found_json),
        sources=_sources(rows, place.path.parent, root, problems),
    )


def _plain_file(path: Path) -> bool:
    """A regular file, not a link (which could lead out of the tree) nor a pipe or device."""
    try:
        return path.is_file() and not path.is_symlink()
    except OSError:  # a name too long, a folder that cannot be searched
        return False


def _rel(path: Path, root: Path) -> str:
    return PurePosixPath(path.relative_to(root)).as_posix()


def _text(path: Path, root: Path, problems: list[Problem]) -> str | None:
    """A file's text, or None and a problem when it cannot be read as text."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        problems.append(Problem(reason=f"{_rel(path, root)}: unreadable ({exc.strerror or exc})"))
        return None
    text, why = as_text(data)
    if text is None:
        problems.append(Problem(reason=f"{_rel(path, root)}: {why}, not read"))
    return text


def _json(path: Path, root: Path, problems: list[Problem]) -> dict[str, object] | None:
    text = _text(path, root, problems)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        problems.append(Problem(reason=f"{_rel(path, root)}: not JSON, not read"))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(reason=f"{_rel(path, root)}: not a JSON object, not read"))
        return None
    return data


def _companions(place: _Place, kind: str) -> list[Path]:
    """``<base>/<kind>/<under>.json`` and the files in ``<base>/<kind>/<under>/`` (and the key's own
    folder above a model's one), existing only."""
    if place.base is None:
        return []
    top = place.base / kind
    folders = [top / place.under] if place.under else [top]
    if place.model and place.copy is None:
        folders.append(top / place.key)
    found = [p for p in (top / f"{place.under}.json",) if place.under and _plain_file(p)]
    for folder in folders:
        if folder.is_dir() and not folder.is_symlink():
            found += sorted(p for p in folder.iterdir() if _plain_file(p))
    return found


def _checkpoint(
    read: list[tuple[Path, dict[str, object]]], root: Path
) -> tuple[dict[str, object] | None, str | None]:
    """The shape's checkpoint: of the JSON files found, the first naming a best TFLOPS, else the first."""
    if not read:
        return None, None
    path, data = next(((p, d) for p, d in read if any(k in d for k in _BEST_KEYS)), read[0])
    return data, _rel(path, root)


def _dsl_of(checkpoint: dict[str, object] | None) -> str | None:
    dsl = checkpoint.get("dsl") if checkpoint else None
    return dsl if isinstance(dsl, str) and dsl else None


def _disagreement(checkpoint: dict[str, object], source: str, rows: list[Row]) -> list[Problem]:
    best = next((checkpoint[k] for k in _BEST_KEYS if k in checkpoint), None)
    if not isinstance(best, int | float) or isinstance(best, bool):
        return []
    measured = [r.tflops for r in rows if r.tflops is not None]
    if any(math.isclose(best, t, rel_tol=1e-3) for t in measured):
        return []
    return [Problem(reason=f"{source}: best TFLOPS {best} is not among the log's rows")]


def _reference(rows: list[Row], place: _Place, root: Path, problems: list[Problem]) -> float | None:
    """The highest reference row; without one, the baseline file's TFLOPS."""
    measured = [r.tflops for r in rows if r.reference and r.tflops is not None]
    if measured:
        return max(measured)
    for path in _companions(place, "baseline"):
        data = _json(path, root, problems) if path.suffix == ".json" else None
        value = next((data[k] for k in _REFERENCE_KEYS if data and k in data), None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _ideas(
    place: _Place, root: Path, problems: list[Problem], checkpoints: list[tuple[Path, dict[str, object]]]
) -> list[IdeaNote]:
    """Ideas from the idea logs and memories (JSON lines) and from ``current_idea.json`` (read already
    with the checkpoints)."""
    folder = place.path.parent
    paths = [folder / name for name in IDEA_FILES if _plain_file(folder / name)]
    paths += [p for p in _companions(place, "memory") if p.name in IDEA_FILES]
    notes: list[IdeaNote] = []
    for path in paths:
        text = _text(path, root, problems)
        for number, line in enumerate(text.splitlines() if text else [], start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError:
                problems.append(Problem(reason=f"{_rel(path, root)} line {number}: not JSON, not read"))
                continue
            notes += _note(data, _rel(path, root), number)
    for path, data in checkpoints:
        if path.name == "current_idea.json":
            notes += _note(data, _rel(path, root), None)
    return notes


def _note(data: object, source: str, number: int | None) -> list[IdeaNote]:
    if not isinstance(data, dict):
        return []
    summary = next((str(data[k]) for k in _IDEA_TEXT if isinstance(data.get(k), str) and data[k]), "")
    if not summary:
        return []
    raw_iter = data.get("iter", data.get("iteration"))
    iteration = _iteration_of(raw_iter)
    decision = data.get("decision", data.get("status"))
    return [
        IdeaNote(
            summary=summary,
            iteration=iteration,
            decision=str(decision) if decision is not None else None,
            source=source,
            line=number,
        )
    ]


def _iteration_of(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    found = re.search(r"\d+", str(value)) if isinstance(value, str) else None
    return int(found.group(0)) if found else None


def _sources(rows: list[Row], folder: Path, root: Path, problems: list[Problem]) -> dict[str, str]:
    """Kernel paths the rows name that exist inside SRC; a path leaving the tree is refused, unread."""
    bases = [folder, *folder.parents]
    bases = [b for b in bases if b == root or root in b.parents]
    sources: dict[str, str] = {}
    refused: set[str] = set()
    for row in rows:
        named = row.kernel
        if not _looks_like_path(named) or named in sources or named in refused:
            continue
        pure = PurePosixPath(named.replace("\\", "/"))
        if pure.is_absolute() or ".." in pure.parts or Path(named).is_absolute():
            refused.add(named)
            problems.append(Problem(line=row.line, reason=f"kernel path {named!r} leaves the tree, not read"))
            continue
        found = next((b / pure for b in bases if _plain_file(b / pure)), None)
        if found is not None:
            sources[named] = _rel(found, root)
    return sources


def _looks_like_path(named: str) -> bool:
    return "/" in named or PurePosixPath(named).suffix in _KERNEL_SUFFIXES


def _same_log(place: _Place, other: _Place) -> bool:
    """Could ``place`` (read later) be a copy of ``other``: same key, and the same model when it names one."""
    if place.copy == "orig":
        return other.path == place.path.with_name("results.tsv") or (
            other.key == place.key and other.model == place.model
        )
    return other.key == place.key and (place.model is None or place.model == other.model)


def _duplicates(place: _Place, log: SourceLog, other: _Place, other_log: SourceLog) -> bool:
    if place.copy is None:
        return False
    try:
        if place.path.read_bytes() == other.path.read_bytes():
            return True
    except OSError:
        return False
    mine, theirs = _row_set(log.rows), _row_set(other_log.rows)
    return bool(mine) and mine <= theirs


def _row_set(rows: list[Row]) -> set[tuple[object, ...]]:
    return {(r.original_id, r.decision, r.tflops, r.kernel, r.idea) for r in rows}


def _copy_why(place: _Place, same: list[tuple[_Place, SourceLog]]) -> str:
    return f"side copy ({place.copy}) with rows {same[0][1].source} lacks"


def _decide(logs: list[SourceLog], gpu: str | None) -> list[SourceLog]:
    """skipped: no rows; history: croqq cannot tune the key, or several logs hold it; else resumable.
    Logs hold one shape when their GPU (``gpu`` when given: every log is imported for it), dsl and
    croqq key are the same."""
    groups: dict[tuple[object, ...], list[SourceLog]] = {}
    for log in logs:
        if log.imported_as == "resumable" and log.rows and log.key.croqq_key:
            groups.setdefault((gpu or log.gpu, log.dsl, log.key.croqq_key), []).append(log)
    shared = {id(log): group for group in groups.values() if len(group) > 1 for log in group}
    decided = []
    for log in logs:
        if not log.rows:
            update = {"imported_as": "skipped", "why": "no rows read"}
        elif log.imported_as == "history":
            update = {}
        elif log.key.croqq_key is None:
            update = {"imported_as": "history", "why": _untunable(log.key)}
        elif id(log) in shared:
            others = ", ".join(o.model or o.source for o in shared[id(log)])
            update = {"imported_as": "history", "why": f"several logs of one shape ({others})"}
        else:
            update = {}
        decided.append(log.model_copy(update=update) if update else log)
    return decided


def _untunable(key: ParsedKey) -> str:
    if not key.gemm:
        return f"not a dense GEMM croqq tunes (op {key.op or 'unknown'})"
    return f"croqq has no dtype for {key.dtypes or 'an unnamed dtype'}"
