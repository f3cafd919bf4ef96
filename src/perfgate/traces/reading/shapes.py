"""FLOPs and bytes of the ops whose input shapes a trace recorded (``record_shapes=True``).

torch.profiler writes ``"Input Dims"`` and ``"Input type"`` into the args of CPU ops. For the ops below
the work follows from the shapes alone:

- GEMM: ``aten::mm`` / ``addmm`` 2*M*K*N, ``bmm`` / ``baddbmm`` / ``addbmm`` 2*B*M*K*N (bias adds not
  counted). ``aten::linear`` and ``aten::matmul`` are not counted themselves: they dispatch to these.
- attention: ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention`` (and the CPU flash kernel)
  4*B*H*Sq*Sk*D (QK^T and PV, dense: a causal mask does about half, so efficiency reads low by up to
  2x); their ``_backward`` ops 2.5x that (two matmuls per product plus the recomputed scores).
- copies: ``aten::copy_`` moves numel * (source + destination element size) bytes.

Only the args of events with these names are decoded, in one call per batch; an op whose name and
shapes were seen before in the batch is not worked out again.
"""

from __future__ import annotations

import math
from typing import Any, cast

import msgspec

__all__ = ["ATTENTION_OPS", "COPY_OPS", "GEMM_OPS", "SHAPE_OPS", "ShapeMemo", "shape_work", "shapes_work"]

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm"})
_ATTN_FWD = (
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
)
ATTENTION_OPS = frozenset(_ATTN_FWD + tuple(n + "_backward" for n in _ATTN_FWD))
COPY_OPS = frozenset({"aten::copy_"})
SHAPE_OPS = GEMM_OPS | ATTENTION_OPS | COPY_OPS

# Element sizes of torch's "Input type" strings; precision names as in hardware/peaks.json.
_ELEMENT: dict[str, tuple[int, str | None]] = {
    "float": (4, "fp32"),
    "double": (8, None),
    "c10::Half": (2, "fp16"),
    "c10::BFloat16": (2, "bf16"),
    "c10::Float8_e4m3fn": (1, "fp8"),
    "c10::Float8_e5m2": (1, "fp8"),
    "signed char": (1, "int8"),
    "unsigned char": (1, None),
    "int": (4, None),
    "long int": (8, None),
    "long": (8, None),
    "bool": (1, None),
}
PRECISION_CODES: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8", "int8", "other")


class _ShapeArgs(msgspec.Struct, gc=False):
    dims: Any = msgspec.field(default=None, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")


class _RawShapeArgs(msgspec.Struct, gc=False):
    """The two keys kept as raw JSON: repeated shapes are then recognized by their bytes."""

    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


_DECODE_RAW = msgspec.json.Decoder(list[_RawShapeArgs])
_DECODE_RAW_ONE = msgspec.json.Decoder(_RawShapeArgs)
_ANY = msgspec.json.Decoder()


ShapeMemo = dict[tuple[str, bytes, bytes], tuple[float, float, int]]
"""`shape_work` by (op name, raw ``Input Dims``, raw ``Input type``)."""


def shapes_work(
    names: list[str], raws: list[msgspec.Raw], seen: ShapeMemo | None = None
) -> list[tuple[float, float, int]]:
    """`shape_work` of many ops; an op whose name and shapes were seen before (in this call, or in ``seen``,
    which is filled as it goes: a reader passes one for all the batches of a trace) is not worked out again."""
    parts = [r if r else b"{}" for r in raws]
    decoded: list[_RawShapeArgs]
    try:
        decoded = _DECODE_RAW.decode(b"[" + b",".join(parts) + b"]")
    except msgspec.DecodeError:
        decoded = []
        for part in parts:
            try:
                decoded.append(_DECODE_RAW_ONE.decode(part))
            except msgspec.DecodeError:
                decoded.append(_RawShapeArgs())
    seen = {} if seen is None else seen
    out: list[tuple[float, float, int]] = []
    for name, a in zip(names, decoded, strict=True):
        key = (name, bytes(a.dims), bytes(a.types))
        hit = seen.get(key)
        if hit is None:
            try:
                args = _ShapeArgs(
                    dims=_ANY.decode(a.dims) if a.dims else None,
                    types=_ANY.decode(a.types) if a.types else None,
                )
            except msgspec.DecodeError:
                args = _ShapeArgs()
            hit = seen[key] = shape_work(name, args)
        out.append(hit)
    return out


def _shape(dims: list[Any], i: int) -> list[int] | None:
    if i >= len(dims) or not isinstance(dims[i], list):
        return None
    out = dims[i]
    if not all(isinstance(d, int) and d >= 0 for d in out):
        return None
    return out


def shape_work(name: str, args: _ShapeArgs) -> tuple[float, float, int]:
    """(FLOPs, bytes, precision code) of one op; NaN where the shapes do not fit the op."""
    nan = (math.nan, math.nan, len(PRECISION_CODES) - 1)
    dims, types = args.dims, args.types
    if not isinstance(dims, list):
        return nan
    dims_l = cast("list[Any]", dims)
    types_l = cast("list[Any]", types) if isinstance(types, list) else []

    def elem(i: int) -> tuple[int, int]:
        t = types_l[i] if i < len(types_l) and isinstance(types_l[i], str) else ""
        size, prec = _ELEMENT.get(t, (0, None))
        code = PRECISION_CODES.index(prec) if prec in PRECISION_CODES else len(PRECISION_CODES) - 1
        return size, code

    if name in GEMM_OPS:
        first = 0 if name in ("aten::mm", "aten::bmm") else 1
        a, b = _shape(dims_l, first), _shape(dims_l, first + 1)
        if a is None or b is None or len(a) != len(b) or len(a) not in (2, 3) or a[-1] != b[-2]:
            return nan
        batch = a[0] if len(a) == 3 else 1
        m, k, n = a[-2], a[-1], b[-1]
        size, code = elem(first)
        flops = 2.0 * batch * m * k * n
        nbytes = float(size * batch * (m * k + k * n + m * n))
        return flops, nbytes, code
    if name in ATTENTION_OPS:
        backward = name.endswith("_backward")
        first = 1 if backward else 0
        q, k, v = (_shape(dims_l, first + j) for j in range(3))
        if q is None or k is None or v is None or len(q) != 4 or len(k) != 4 or len(v) != 4:
            return nan
        b, h, sq, d = q
        sk, dv = k[2], v[3]
        flops = 2.0 * b * h * sq * sk * (d + dv) * (2.5 if backward else 1.0)
        size, code = elem(first)
        nbytes = float(size * b * h * (sq * d + sk * d + sk * dv + sq * dv))
        return flops, nbytes, code
    if name in COPY_OPS:
        dst = _shape(dims_l, 0)
        if dst is None:
            return nan
        dsize, _ = elem(0)
        ssize, code = elem(1)
        return 0.0, float(math.prod(dst) * (dsize + ssize)), code
    return nan
