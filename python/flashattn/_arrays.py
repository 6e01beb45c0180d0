"""NumPy arrays and other DLPack producers on the CPU engine, zero-copy.

Inputs are read where they lie: a NumPy array through its own pointer and strides, anything else
through DLPack. Outputs are new NumPy arrays (bf16 ones need the ml_dtypes package, which gives
NumPy a bfloat16 dtype). There is no autograd here; use torch tensors for gradients.
"""
import numpy as np

from . import _C

_NUMPY_CODES = {"float16": _C.F16, "float32": _C.F32, "float64": _C.F64, "int32": _C.I32, "bfloat16": _C.BF16}


def _numpy_dtype(code):
    if code == _C.BF16:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("flashattn: bf16 results as NumPy arrays need the ml_dtypes package "
                            "(pip install ml-dtypes), or pass torch tensors") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({_C.F16: np.float16, _C.F32: np.float32, _C.F64: np.float64, _C.I32: np.int32}[code])


def view(x, name, writable=False):
    """A _C.View of a NumPy array or DLPack producer; `writable` for what the library writes."""
    if isinstance(x, np.ndarray):
        code = _NUMPY_CODES.get(x.dtype.name)
        if code is None:
            raise ValueError(f"{name}: NumPy dtype {x.dtype} is not supported "
                             "(float16, bfloat16 through ml_dtypes, float32, float64; int32 for indices)")
        if not x.dtype.isnative:
            raise ValueError(f"{name}: byte order {x.dtype.byteorder!r} is not this machine's "
                             "(convert with x.astype(x.dtype.newbyteorder('=')))")
        if writable and not x.flags.writeable:
            raise ValueError(f"{name}: the array is read-only, but flashattn writes into it")
        item = x.dtype.itemsize
        if any(s % item for s in x.strides):
            raise ValueError(f"{name}: strides {x.strides} (bytes) are not multiples of the element size {item}")
        return _C.View.raw(x.__array_interface__["data"][0], code, _C.CPU, 0, x.shape,
                           [s // item for s in x.strides])
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"{name}: expected a torch tensor, a NumPy array or a DLPack producer, got {type(x).__name__}")
    return _C.View.from_dlpack(x, writable)


def _new(shape, code):
    a = np.empty(shape, dtype=_numpy_dtype(code))
    return a, _C.View.raw(a.__array_interface__["data"][0], code, _C.CPU, 0, a.shape,
                          [s // a.dtype.itemsize for s in a.strides])


def _lse_code(code):
    return _C.F64 if code == _C.F64 else _C.F32


def _on_cpu(v, name):
    if v.device != _C.CPU:
        raise ValueError(f"{name}: arrays on a CUDA device need torch tensors (this path allocates its results "
                         "with NumPy, on the CPU)")


def _optional(x, name):
    return None if x is None else view(x, name)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap):
    qv, kv, vv = view(q, "q"), view(k, "k"), view(v, "v")
    _on_cpu(qv, "q")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    s = qv.shape
    if len(s) != (3 if varlen else 4):
        raise ValueError(f"q: expected rank {3 if varlen else 4}, got shape {tuple(s)}")
    out, out_v = _new(s, qv.dtype)
    lse, lse_v = _new((s[1], s[0]) if varlen else (s[0], s[2], s[1]), _lse_code(qv.dtype))
    _C.forward(qv, kv, vv, out_v, lse_v, _optional(cu_seqlens_q, "cu_seqlens_q"),
               _optional(cu_seqlens_k, "cu_seqlens_k"), softmax_scale=softmax_scale, causal=causal,
               window_left=window_left, window_right=window_right, softcap=softcap, num_threads=0, stream=0)
    return out, lse


def decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window_left, window_right,
           softcap, num_splits):
    qv = view(q, "q")
    _on_cpu(qv, "q")
    s = qv.shape
    if len(s) != 4:
        raise ValueError(f"q: expected rank 4 [batch, seqlen_new, heads_q, head_dim], got shape {tuple(s)}")
    appending = k is not None or v is not None
    out, out_v = _new(s, qv.dtype)
    lse, lse_v = _new((s[0], s[2], s[1]), _lse_code(qv.dtype))
    _C.decode(qv, view(k_cache, "k_cache", writable=appending), view(v_cache, "v_cache", writable=appending),
              _optional(block_table, "block_table"), view(cache_seqlens, "cache_seqlens"), _optional(k, "k"),
              _optional(v, "v"), out_v, lse_v, num_splits=num_splits, softmax_scale=softmax_scale, causal=causal,
              window_left=window_left, window_right=window_right, softcap=softcap, num_threads=0, stream=0)
    return out, lse


def merge_states(o_parts, lse_parts):
    ov = view(o_parts, "o_parts")
    _on_cpu(ov, "o_parts")
    s = ov.shape
    if len(s) != 4:
        raise ValueError(f"o_parts: expected rank 4 [num_parts, tokens, heads, head_dim], got shape {tuple(s)}")
    out, out_v = _new(s[1:], ov.dtype)
    lse, lse_v = _new(s[1:3], _lse_code(ov.dtype))
    _C.merge_states(ov, view(lse_parts, "lse_parts"), out_v, lse_v, num_threads=0, stream=0)
    return out, lse


def full_seqlens(batch, n):
    return np.full((batch,), n, dtype=np.int32)
