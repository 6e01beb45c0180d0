"""Standard attention written from the header's semantics, independent of the library, in NumPy.

ref64 runs it in float64 (the reference); plain runs the same steps in the inputs' own precision,
which sets the bar of FlashAttention's accuracy rule: a kernel's max error against ref64 must be at
most `factor` x the plain implementation's error + atol.
"""
import numpy as np

ATOL = {"float64": 1e-10, "float32": 2e-6, "float16": 1e-4, "bfloat16": 1e-3}


def visible(seqlen_q, seqlen_k, causal=False, window=(-1, -1)):
    """[seqlen_q, seqlen_k] bool: query i sees key j (bottom-right aligned causal and windows)."""
    left, right = window
    if causal:
        right = 0
    i = np.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    j = np.arange(seqlen_k)[None, :]
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    return mask


def attention(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, dtype=np.float64):
    """q [b, sq, hq, d], k, v [b, sk, hk, d] -> out [b, sq, hq, d], lse [b, hq, sq], computed in `dtype`."""
    q, k, v = (np.asarray(x, dtype=np.float64).astype(dtype) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    # The library's options are C floats (flashattn.hpp: AttnOptions), so the scale and softcap it
    # applies, even to f64 inputs, are the float32 roundings of the ones asked for.
    scale = float(np.float32(1.0 / np.sqrt(d) if scale is None else scale))
    softcap = float(np.float32(softcap))
    k = np.repeat(k, hq // hk, axis=2)
    v = np.repeat(v, hq // hk, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * dtype(scale)
    if softcap > 0:
        s = dtype(softcap) * np.tanh(s / dtype(softcap))
    s = np.where(visible(sq, sk, causal, window), s, -np.inf).astype(dtype)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    empty = np.isneginf(m)
    p = np.exp(s - np.where(empty, 0, m))
    denom = p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", p / np.where(empty, 1, denom), v)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1, denom)))[..., 0]
    return out.astype(dtype), lse.astype(dtype)


def varlen_attention(q, k, v, cu_q, cu_k, dtype=np.float64, **opts):
    """Packed q [total_q, hq, d], k, v [total_k, hk, d] -> out [total_q, hq, d], lse [hq, total_q]."""
    out = np.zeros(q.shape, dtype=dtype)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf, dtype=dtype)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        o, row_lse = attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dtype=dtype, **opts)
        out[q0:q1], lse[:, q0:q1] = o[0], row_lse[0]
    return out, lse


def max_err(a, b):
    """Max |a - b| where matching infinities agree and a NaN or a mismatched infinity is infinite error."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    both_inf = np.isinf(a) & np.isinf(b) & (a == b)
    bad = np.isnan(a) | np.isnan(b) | ((np.isinf(a) | np.isinf(b)) & ~both_inf)
    if bad.any():
        return np.inf
    with np.errstate(invalid="ignore"):  # inf - inf where both agree, masked out here
        d = np.abs(np.where(both_inf, 0, a - b))
    return float(d.max()) if d.size else 0.0


def assert_rule(kernel, ref64, plain, dtype_name, factor=2.0, what="out"):
    err, base = max_err(kernel, ref64), max_err(plain, ref64)
    bound = factor * base + ATOL[dtype_name]
    assert err <= bound, (f"{what}: max error {err:.3g} exceeds {factor} x plain error {base:.3g} "
                          f"+ atol {ATOL[dtype_name]}")
