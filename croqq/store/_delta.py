"""git's delta format: encode one object as a delta against another, apply a delta.

A delta (git's pack format, ``OFS_DELTA`` entries) is the base's size and the result's size (7-bit
little-endian varints), then instructions: *copy* ``size`` bytes from ``offset`` of the base
(``0x80 | which offset/size bytes follow``), or *insert* the next 1..127 literal bytes.

The encoder is made for the results repo's files, whose versions differ by an append (results.tsv,
rounds.raw.jsonl, rounds.md, ideas.jsonl), one changed line (state.json), a few changed fields (a
checkpoint) or one changed record (a tree): the common prefix and suffix are copies, and the middle is
matched line by line against the base (lines that appear in the base become copies), which also covers
rows that moved (compaction-summary.md). It never searches for arbitrary substrings; what it does not
match is inserted, so any pair of objects gives a correct, if sometimes long, delta.
"""

from __future__ import annotations

COPY_MAX = 0xFFFFFF
INSERT_MAX = 0x7F
MIN_LINE = 8  # shorter lines are inserted, not copied (a copy instruction costs up to 8 bytes)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class _Writer:
    def __init__(self, base_size: int, size: int) -> None:
        self.out = bytearray(_varint(base_size) + _varint(size))

    def copy(self, offset: int, size: int) -> None:
        while size > 0:
            step = min(size, COPY_MAX)
            op, args = 0x80, bytearray()
            for i in range(4):
                byte = (offset >> (8 * i)) & 0xFF
                if byte:
                    op |= 1 << i
                    args.append(byte)
            for i in range(3):
                byte = (step >> (8 * i)) & 0xFF
                if byte:
                    op |= 0x10 << i
                    args.append(byte)
            self.out.append(op)
            self.out += args
            offset += step
            size -= step

    def insert(self, data: bytes | memoryview) -> None:
        for start in range(0, len(data), INSERT_MAX):
            chunk = data[start : start + INSERT_MAX]
            self.out.append(len(chunk))
            self.out += chunk


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    n = min(len(a), len(b), limit)
    if n == 0:
        return 0
    if a[len(a) - n :] == b[len(b) - n :]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid
    return lo


def _line_index(base: bytes) -> dict[bytes, int]:
    """Each line of the base (with its newline) -> its first offset."""
    index: dict[bytes, int] = {}
    start = 0
    while start < len(base):
        end = base.find(b"\n", start)
        end = len(base) if end < 0 else end + 1
        if end - start >= MIN_LINE:
            index.setdefault(base[start:end], start)
        start = end
    return index


def _middle(w: _Writer, base: bytes, middle: bytes) -> None:
    """Copy the lines of ``middle`` found in ``base`` (runs of consecutive base lines as one copy), insert
    the rest."""
    if b"\n" not in middle or len(middle) < 4 * MIN_LINE:
        w.insert(middle)
        return
    index = _line_index(base)
    literal = bytearray()
    run_start = run_end = -1
    start = 0
    while start < len(middle):
        end = middle.find(b"\n", start)
        end = len(middle) if end < 0 else end + 1
        line = middle[start:end]
        at = index.get(line) if len(line) >= MIN_LINE else None
        if at is not None and at == run_end:  # continues the current copy
            run_end += len(line)
        elif at is not None:
            if run_start >= 0:
                w.copy(run_start, run_end - run_start)
            elif literal:
                w.insert(bytes(literal))
                literal.clear()
            run_start, run_end = at, at + len(line)
        else:
            if run_start >= 0:
                w.copy(run_start, run_end - run_start)
                run_start = run_end = -1
            literal += line
        start = end
    if run_start >= 0:
        w.copy(run_start, run_end - run_start)
    elif literal:
        w.insert(bytes(literal))


def make_delta(base: bytes, target: bytes) -> bytes:
    """A delta that turns ``base`` into ``target``."""
    w = _Writer(len(base), len(target))
    prefix = _common_prefix(base, target)
    suffix = _common_suffix(base, target, min(len(base), len(target)) - prefix)
    if prefix:
        w.copy(0, prefix)
    middle = target[prefix : len(target) - suffix]
    if middle:
        _middle(w, base, middle)
    if suffix:
        w.copy(len(base) - suffix, suffix)
    return bytes(w.out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def append_delta(base_size: int, target: bytes) -> bytes:
    """The delta of a ``target`` that is its base (``base_size`` bytes) plus appended bytes."""
    w = _Writer(base_size, len(target))
    if base_size:
        w.copy(0, base_size)
    w.insert(target[base_size:])
    return bytes(w.out)


def delta_sizes(delta: bytes) -> tuple[int, int]:
    """(base size, result size) of a delta, from its first bytes."""
    base_size, pos = _read_varint(delta, 0)
    return base_size, _read_varint(delta, pos)[0]


def apply_delta(base: bytes, delta: bytes) -> bytes:
    """The object a delta makes of ``base``; ValueError when the delta does not fit the base."""
    base_size, pos = _read_varint(delta, 0)
    size, pos = _read_varint(delta, pos)
    if base_size != len(base):
        raise ValueError(f"delta is for a base of {base_size} bytes, not {len(base)}")
    out = bytearray()
    while pos < len(delta):
        op = delta[pos]
        pos += 1
        if op & 0x80:
            offset = length = 0
            for i in range(4):
                if op & (1 << i):
                    offset |= delta[pos] << (8 * i)
                    pos += 1
            for i in range(3):
                if op & (0x10 << i):
                    length |= delta[pos] << (8 * i)
                    pos += 1
            length = length or 0x10000
            out += base[offset : offset + length]
        elif op:
            out += delta[pos : pos + op]
            pos += op
        else:
            raise ValueError("delta instruction 0 is reserved")
    if len(out) != size:
        raise ValueError(f"delta made {len(out)} bytes, expected {size}")
    return bytes(out)
