"""A tree's shape key read into its parts: op, dtype segment, croqq's dtype, M/N/K.

Keys are written ``<op>_<dtypes>_<M>x<N>x<K>[_extra]`` (the op may be missing), ``M8192_N8192_K4096`` or
``m8192n8192k8192`` (shape only: the op and dtypes come from the model folder's name), or name a problem
that is not a GEMM at all. Only a dense GEMM (op ``matmul``/``gemm`` or none) with a dtype croqq has and a
shape is one croqq can tune; everything else keeps its parts for the record.
"""

from __future__ import annotations

import re

from croqq.store.importer.model import ParsedKey

DENSE_OPS = frozenset({"matmul", "gemm"})
# The input dtype (the first of the segment) -> croqq's dtype name; anything else croqq has no kernels for.
CROQQ_DTYPE = {"f16": "f16", "fp16": "f16", "e4m3": "e4m3", "fp8": "e4m3"}
_DTYPE_TOKENS = (
    "bf16", "fp16", "f16", "tf32", "fp32", "f32", "e4m3", "e5m2", "fp8", "fp4", "nvfp4", "int8", "i8",
)  # fmt: skip
_DTYPE_SEGMENT = re.compile(f"(?:{'|'.join(_DTYPE_TOKENS)})+")
_DTYPE_TOKEN = re.compile("|".join(_DTYPE_TOKENS))
_MNK = re.compile(r"(\d+)x(\d+)x(\d+)")
_SHAPE_ONLY = re.compile(r"[Mm](\d+)_?[Nn](\d+)_?[Kk](\d+)")


def parse_key(text: str, model: str | None = None) -> ParsedKey:
    """Read a key as the tree writes it; ``model`` is the agent/model folder, the op of a shape-only key."""
    shape_only = _SHAPE_ONLY.fullmatch(text)
    if shape_only:
        m, n, k = (int(v) for v in shape_only.groups())
        op, dtypes = _op_and_dtypes(model.rsplit("/", 1)[-1] if model else "")
        return _parsed(text, op, dtypes, (m, n, k), extra=False)
    parts = text.split("_")
    dtype_at = next((i for i, part in enumerate(parts) if _DTYPE_SEGMENT.fullmatch(part)), None)
    shape_at = next((i for i, part in enumerate(parts) if _MNK.fullmatch(part)), None)
    if dtype_at is None or (shape_at is not None and shape_at < dtype_at):
        return ParsedKey(raw=text, op=text if shape_at is None else "_".join(parts[:shape_at]) or None)
    op = "_".join(parts[:dtype_at]) or None
    if shape_at is None:
        return _parsed(text, op, parts[dtype_at], None, extra=True)
    mnk = _MNK.fullmatch(parts[shape_at])
    assert mnk is not None
    m, n, k = (int(v) for v in mnk.groups())
    extra = shape_at != dtype_at + 1 or shape_at != len(parts) - 1
    return _parsed(text, op, parts[dtype_at], (m, n, k), extra=extra)


def _op_and_dtypes(name: str) -> tuple[str | None, str]:
    """A model folder named ``matmul_f16`` gives op and dtypes; a plain name is only the op."""
    parts = name.split("_")
    dtype_at = next((i for i, part in enumerate(parts) if _DTYPE_SEGMENT.fullmatch(part)), None)
    if dtype_at is None:
        return name or None, ""
    return "_".join(parts[:dtype_at]) or None, parts[dtype_at]


def _parsed(
    raw: str, op: str | None, dtypes: str, mnk: tuple[int, int, int] | None, *, extra: bool
) -> ParsedKey:
    first = _DTYPE_TOKEN.match(dtypes) if dtypes else None
    dtype = CROQQ_DTYPE.get(first.group(0)) if first else None
    m, n, k = mnk if mnk else (None, None, None)
    dense = op in DENSE_OPS or (op is None and bool(dtypes))
    gemm = dense and mnk is not None and not extra
    return ParsedKey(raw=raw, op=op, dtype=dtype, dtypes=dtypes, m=m, n=n, k=k, gemm=gemm)
