"""Pure rendering of the results repo's text files: results.tsv, rounds.md, perf files, state.json,
commit messages and the compaction summary. No I/O here; the writer decides where text goes.

results.tsv: a header line (``RESULTS_COLUMNS``), then one line per iteration. Inside a field, backslash,
tab, newline and carriage return are written as ``\\\\``, ``\\t``, ``\\n``, ``\\r`` so that a row is always
exactly one line; a file that does not end with a newline has a truncated last line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from croqq.domain.records import GpuSnapshot, Measurement
from croqq.domain.schedule import is_complete
from croqq.errors import InvalidRecordError
from croqq.store.schema import (
    RESULTS_COLUMNS,
    SCHEMA_VERSION,
    Checkpoint,
    ResultsRow,
    RoundRecord,
    SiblingRecord,
    StateEntry,
    StateFile,
    StoreRequest,
)

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


# -- results.tsv ------------------------------------------------------------------------------------


def _escape(text: str) -> str:
    return "".join(_ESCAPES.get(ch, ch) for ch in text) if any(c in text for c in _ESCAPES) else text


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, "")
        if nxt not in _UNESCAPES:
            raise ValueError(f"bad escape \\{nxt}")
        out.append(_UNESCAPES[nxt])
    return "".join(out)


def tsv_header() -> str:
    return "\t".join(RESULTS_COLUMNS) + "\n"


def tsv_line(row: ResultsRow) -> str:
    fields = [
        f"{row.iter:03d}",
        row.kernel,
        f"{row.tflops:.3f}",
        f"{row.hw_eff_pct:.2f}",
        row.decision,
        row.bottleneck,
        row.idea_summary,
        row.run_command,
    ]
    return "\t".join(_escape(f) for f in fields) + "\n"


def results_row(rnd: RoundRecord) -> ResultsRow:
    """The results.tsv row of one round."""
    return ResultsRow(
        iter=rnd.iteration,
        kernel=rnd.kernel,
        tflops=rnd.tflops,
        hw_eff_pct=rnd.hw_eff_pct,
        decision=rnd.decision,
        bottleneck=rnd.bottleneck,
        idea_summary=rnd.idea.summary if rnd.idea else "baseline",
        run_command=rnd.run_command,
    )


def _parse_row(line: str) -> ResultsRow:
    fields = line.split("\t")
    if len(fields) != len(RESULTS_COLUMNS):
        raise ValueError(f"expected {len(RESULTS_COLUMNS)} tab-separated fields, found {len(fields)}")
    values = [_unescape(f) for f in fields]
    try:
        return ResultsRow.model_validate(dict(zip(RESULTS_COLUMNS, values, strict=True)))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def parse_tsv(text: str, source: str = "results.tsv") -> list[ResultsRow]:
    """Rows of a results.tsv; InvalidRecordError naming ``source`` and the line on any bad line."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[0] + "\n" != tsv_header():
        raise InvalidRecordError(f"{source}: line 1: header is not {'|'.join(RESULTS_COLUMNS)}")
    if lines[-1] != "":
        raise InvalidRecordError(f"{source}: line {len(lines)}: truncated (no newline at the end)")
    rows = []
    for number, line in enumerate(lines[1:-1], start=2):
        try:
            rows.append(_parse_row(line))
        except ValueError as exc:
            raise InvalidRecordError(f"{source}: line {number}: {exc}") from None
    return rows


# -- rounds.md, perf files ------------------------------------------------------------------------


def rounds_md_header(key: str) -> str:
    return f"# Rounds of {key}\n\nOne section per measured iteration, newest last.\n\n"


def _oneline(text: str) -> str:
    return " ".join(text.split())


def _sibling_line(candidate: int, sib: SiblingRecord) -> str:
    """One of the iteration's other candidates, beside candidate ``candidate`` (the measured one)."""
    what = f"`{sib.idea.tag}`: {_oneline(sib.idea.summary)}" if sib.idea else "no candidate"
    m = sib.measurement
    if sib.repeat_of is not None:
        how = f"repeats candidate {sib.repeat_of}"
    elif sib.rejection is not None:
        how = f"refused ({sib.rejection.kind}): {_oneline(sib.rejection.reason)}"
    elif sib.built is False:
        how = f"did not build: {_oneline(sib.build_reason)}"
    elif m is not None:
        how = f"measured {m.outcome}, {m.tflops:.2f} TFLOPS in the same batch" + (
            f", `{sib.kernel}`" if sib.kernel else ""
        )
    else:
        how = "not measured"
    return f"- candidate {sib.candidate} (beside {candidate}): {what}; {how}"


def round_markdown(rnd: RoundRecord) -> str:
    """A readable section for one round (the same facts as its rounds.raw.jsonl line)."""
    cand = rnd.measure.candidate
    idea = rnd.idea
    title = f"`{idea.tag}`: {_oneline(idea.summary)}" if idea else "baseline (seed kernel)"
    knobs = " ".join(f"{k}={v}" for k, v in sorted(rnd.knobs.items()))
    lines = [
        f"## iter{rnd.iteration:03d}: {rnd.decision}, {rnd.tflops:.2f} TFLOPS",
        "",
        f"- idea: {title}" + (f" (strategy {idea.strategy}, proposer {idea.proposer})" if idea else ""),
        f"- knobs: {knobs or '-'}",
        f"- kernel: `{rnd.kernel}`",
        f"- best: {rnd.best_before:.2f} -> {rnd.best_after:.2f} TFLOPS; "
        f"consecutive discards {rnd.consecutive_discards}",
        f"- measured: {cand.outcome}, {cand.tflops:.2f} TFLOPS, {cand.hw_eff_pct:.2f}% of peak, "
        f"median {cand.median_ms:.4f} ms (min {cand.min_ms:.4f}, max {cand.max_ms:.4f}, "
        f"{cand.repeats} repeats), "
        f"verified {'yes' if cand.verified else 'no'}",
    ]
    if cand.detail:
        lines.append(f"- detail: {_oneline(cand.detail)}")
    conf = rnd.measure.confirmation
    if conf is not None:
        lines.append(
            f"- confirmation: candidate {conf.candidate_tflops:.2f} vs best {conf.best_tflops:.2f} "
            f"TFLOPS over {conf.rounds} interleaved rounds"
        )
    if rnd.measure.vendor_tflops is not None:
        lines.append(f"- vendor library: {rnd.measure.vendor_tflops:.2f} TFLOPS")
    lines += [_sibling_line(rnd.candidate, s) for s in rnd.siblings]
    lines.append(f"- bottleneck: {rnd.bottleneck}; strategy {rnd.strategy}")
    lines.append(f"- run: `{_oneline(rnd.run_command) or '-'}`")
    lines.append(f"- gpu {rnd.gpu_uuid or '-'}, epoch {rnd.epoch}, step {rnd.step_id}, {rnd.timestamp}")
    return "\n".join(lines) + "\n\n"


def _snapshot(label: str, snap: GpuSnapshot | None) -> str:
    if snap is None:
        return f"# gpu at {label}: not recorded"
    reasons = ",".join(snap.throttle_reasons) or "none"
    return (
        f"# gpu at {label}: sm {snap.sm_clock_mhz} MHz, mem {snap.mem_clock_mhz} MHz, {snap.temp_c} C, "
        f"{snap.power_w:.1f} W, throttle {reasons}"
    )


def timing_text(rnd: RoundRecord) -> str:
    """shapes/<key>/perf/timing_iterNNN.txt: the measurement's numbers and GPU snapshots, then the raw
    output."""
    cand: Measurement = rnd.measure.candidate
    header = [
        f"# {rnd.key} iter{rnd.iteration:03d} {rnd.decision}",
        f"# outcome {cand.outcome}, verified {'yes' if cand.verified else 'no'}",
        f"# tflops {cand.tflops:.3f}, hw_eff_pct {cand.hw_eff_pct:.2f}, counted tflops {rnd.tflops:.3f}",
        f"# median_ms {cand.median_ms:.5f}, min_ms {cand.min_ms:.5f}, max_ms {cand.max_ms:.5f}, "
        f"repeats {cand.repeats}, spread {cand.spread_pct:.2f}%",
        _snapshot("start", cand.start),
        _snapshot("end", cand.end),
        f"# run: {_oneline(rnd.run_command)}",
        "",
    ]
    raw = cand.raw if cand.raw.endswith("\n") or not cand.raw else cand.raw + "\n"
    return "\n".join(header) + "\n" + raw


def profile_text(rnd: RoundRecord) -> str:
    """shapes/<key>/perf/profile_iterNNN.txt: the profile that informed this round."""
    prof = rnd.profile
    if prof is None:
        return ""
    metrics = [f"# {name} {value:g}" for name, value in sorted(prof.metrics.items())]
    head = [
        f"# {rnd.key} profile before iter{rnd.iteration:03d}",
        f"# bottleneck {prof.bottleneck}",
        *metrics,
        "",
    ]
    raw = prof.raw if prof.raw.endswith("\n") or not prof.raw else prof.raw + "\n"
    return "\n".join(head) + "\n" + raw


# -- state.json -----------------------------------------------------------------------------------


def state_line(key: str, entry: StateEntry) -> str:
    """One shape's line of state.json (kept per key by the writer, so a commit re-renders one line)."""
    return f"    {json.dumps(key)}: {json.dumps(entry.model_dump(mode='json'), sort_keys=True)}"


def state_text(gpu: str, dsl: str, lines: Mapping[str, str]) -> str:
    """state.json with sorted keys, one shape per line (``lines``: key -> state_line(key, entry))."""
    head = (
        f'{{\n  "dsl": {json.dumps(dsl)},\n  "gpu": {json.dumps(gpu)},\n'
        f'  "schema_version": {SCHEMA_VERSION},\n'
    )
    if not lines:
        return head + '  "shapes": {}\n}\n'
    body = ",\n".join([lines[key] for key in sorted(lines)])
    return head + '  "shapes": {\n' + body + "\n  }\n}\n"


# -- commit messages ------------------------------------------------------------------------------


TRAILER_RUN = "Croqq-Run"
TRAILER_STEP = "Croqq-Step"
TRAILER_RESET = "Croqq-Reset"  # on a clean commit: one per shape whose history starts over


def commit_message(req: StoreRequest) -> str:
    """``<key> iter<NNN>: <idea> - TFLOPS: <best before> -> <measured> (<decision>)`` for an iteration,
    ``<key> attempt<N>: <idea> - <kind> failed (no iteration)`` for an attempt (compile, check, agent,
    repeat; with the reason when there was no idea); then git
    trailers naming the run (``<gpu>/<dsl>``: keys repeat across runs) and the step and epoch."""
    if req.attempt is not None:
        att = req.attempt
        summary = _oneline(att.idea.summary if att.idea else f"{att.proposer}: {att.reason}")[:200]
        subject = f"{req.key} attempt{att.attempt_no}: {summary} - {att.kind} failed (no iteration)"
    elif req.round is not None:
        rnd = req.round
        summary = _oneline(rnd.idea.summary) if rnd.idea else "baseline"
        before, after = f"{rnd.best_before:.2f}", f"{rnd.tflops:.2f}"
        subject = (
            f"{req.key} iter{rnd.iteration:03d}: {summary} - TFLOPS: {before} -> {after} ({rnd.decision})"
        )
    else:
        raise InvalidRecordError(f"{req.key}: store request {req.step_id} has neither a round nor an attempt")
    return (
        f"{subject}\n\n{TRAILER_RUN}: {req.gpu}/{req.dsl}\n{TRAILER_STEP}: {req.step_id} epoch {req.epoch}\n"
    )


def group_commit_message(reqs: Sequence[StoreRequest]) -> str:
    """A group commit's message: ``store: <N> record(s)``, then each record's own message (subject and
    trailers) as a paragraph of the body."""
    return f"store: {len(reqs)} record(s)\n\n" + "\n".join(commit_message(r) for r in reqs)


_ITER_SUBJECT = re.compile(r"^(\S+) iter(\d{3,}): ")
_RUN_TRAILER = re.compile(rf"^{TRAILER_RUN}: (\S+)$")


def stored_in_message(message: str) -> list[tuple[str, str, int]]:
    """(run, key, iteration) of each iteration a commit message records: its subject's, or each of a group
    commit's paragraphs (an iteration line followed by its run trailer)."""
    found, pending = [], None
    for line in message.splitlines():
        subject, run = _ITER_SUBJECT.match(line), _RUN_TRAILER.match(line)
        if subject:
            pending = (subject.group(1), int(subject.group(2)))
        elif run and pending:
            found.append((run.group(1), *pending))
            pending = None
    return found


# -- compaction summary ---------------------------------------------------------------------------


def _standing(entry: StateEntry, ckpt: Checkpoint | None) -> str:
    if ckpt is None:
        return "no checkpoint"
    if entry.status == "done":
        return "done" if is_complete(ckpt.status, ckpt.current_iter, ckpt.max_iter) else "done early (reopen)"
    return "active"


def _summary_row(key: str, entry: StateEntry, ckpt: Checkpoint | None) -> str:
    max_iter = str(ckpt.max_iter) if ckpt else "?"
    speedup = f"{entry.best_tflops / entry.baseline_tflops:.2f}x" if entry.baseline_tflops > 0 else "-"
    discards = str(ckpt.consecutive_discards) if ckpt else "?"
    current = str(ckpt.current_iter) if ckpt else "?"
    return (
        f"| {key} | {_standing(entry, ckpt)} | {current}/{max_iter} | {entry.best_tflops:.2f} | "
        f"{entry.baseline_tflops:.2f} | {speedup} | {discards} | `{entry.best_kernel or '-'}` |"
    )


def compaction_summary(state: StateFile, checkpoints: Mapping[str, Checkpoint]) -> str:
    """A markdown digest of where every shape stands, for an agent resuming cold (deterministic:
    the same inputs give the same text, so an unchanged run is not committed again)."""
    standing = {key: _standing(entry, checkpoints.get(key)) for key, entry in state.shapes.items()}
    order = ("active", "done early (reopen)", "no checkpoint", "done")
    counts = ", ".join(f"{sum(1 for s in standing.values() if s == name)} {name}" for name in order)
    lines = [
        f"# Compaction summary: {state.gpu} / {state.dsl}",
        "",
        f"{len(state.shapes)} shapes: {counts}.",
        "A shape is complete only when it is done and iter >= max; an active shape resumes after its last "
        "stored iteration (its checkpoint), a done-early one is reopened.",
        "",
        "| key | status | iter/max | best TFLOPS | baseline TFLOPS | speedup | consecutive discards "
        "| best kernel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted(state.shapes, key=lambda k: (order.index(standing[k]), k))
    lines += [_summary_row(key, state.shapes[key], checkpoints.get(key)) for key in keys]
    return "\n".join(lines) + "\n"
