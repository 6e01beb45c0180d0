"""NumPy arrays and DLPack producers on the CPU engine, against the float64 reference."""
import numpy as np
import pytest

import flashattn
from flashattn import _C
from reference import assert_rule, attention, max_err, varlen_attention, visible

RNG = np.random.default_rng(7)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window=(5, 3)),
    dict(window=(8, -1), causal=True),
    dict(softcap=2.0, scale=0.3),
    dict(causal=True, softcap=5.0, window=(-1, 0)),
]


def call_opts(o):
    return dict(softmax_scale=o.get("scale"), causal=o.get("causal", False), window_size=o.get("window", (-1, -1)),
                softcap=o.get("softcap", 0.0))


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("sq,sk,hq,hk,d", [(37, 53, 4, 2, 64), (61, 29, 2, 2, 96), (1, 70, 8, 1, 32)])
def test_forward_matches_reference(opts, dtype, sq, sk, hq, hk, d):
    q, k, v = randn(2, sq, hq, d, dtype=dtype), randn(2, sk, hk, d, dtype=dtype), randn(2, sk, hk, d, dtype=dtype)
    out, lse = flashattn.flash_attn_func(q, k, v, return_lse=True, **call_opts(opts))
    assert out.dtype == dtype and lse.dtype == (np.float64 if dtype == np.float64 else np.float32)
    ref_o, ref_l = attention(q, k, v, **opts)
    plain_o, plain_l = attention(q, k, v, dtype=dtype, **opts)
    name = np.dtype(dtype).name
    assert_rule(out, ref_o, plain_o, name)
    assert_rule(lse, ref_l, plain_l, name, what="lse")


def test_strided_inputs_are_read_in_place():
    # [b, h, s, d] storage seen as [b, s, h, d], and a head slice: no copy is made, strides are honoured.
    q = randn(2, 4, 33, 64).transpose(0, 2, 1, 3)
    kv = randn(2, 40, 4, 2, 64)
    k, v = kv[:, :, :, 0], kv[:, :, :, 1]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    ref, _ = attention(q, k, v, causal=True)
    plain, _ = attention(q, k, v, causal=True, dtype=np.float32)
    assert_rule(out, ref, plain, "float32")


def test_rows_that_see_no_key_give_zero_and_minus_inf():
    # Bottom-right causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see nothing.
    q, k, v = randn(1, 12, 2, 32), randn(1, 5, 2, 32), randn(1, 5, 2, 32)
    out, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert not visible(12, 5, causal=True)[:7].any()
    assert np.all(out[:, :7] == 0) and np.all(np.isneginf(lse[:, :, :7]))
    assert np.all(np.isfinite(lse[:, :, 7:]))
    ref, ref_l = attention(q, k, v, causal=True)
    assert max_err(out, ref) < 1e-5 and max_err(lse, ref_l) < 1e-5


@pytest.mark.parametrize("opts", [dict(), dict(causal=True), dict(window=(4, 2), softcap=3.0)])
def test_varlen_matches_reference(opts):
    lens_q, lens_k = [7, 0, 19, 1], [11, 4, 19, 30]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, k, v = randn(cu_q[-1], 4, 64), randn(cu_k[-1], 2, 64), randn(cu_k[-1], 2, 64)
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True,
                                                **call_opts(opts))
    ref_o, ref_l = varlen_attention(q, k, v, cu_q, cu_k, **opts)
    plain_o, plain_l = varlen_attention(q, k, v, cu_q, cu_k, dtype=np.float32, **opts)
    assert_rule(out, ref_o, plain_o, "float32")
    assert_rule(lse, ref_l, plain_l, "float32", what="lse")


class DLPackOnly:
    """A producer that offers nothing but the DLPack protocol (as JAX, CuPy or TF arrays do)."""

    def __init__(self, x):
        self._x = x

    def __dlpack__(self, *args, **kwargs):
        return self._x.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._x.__dlpack_device__()


def test_any_dlpack_producer_is_read_zero_copy():
    q, k, v = (randn(2, s, 4, 64, dtype=np.float16) for s in (17, 23, 23))
    direct = flashattn.flash_attn_func(q, k, v, causal=True)
    via = flashattn.flash_attn_func(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), causal=True)
    assert isinstance(via, np.ndarray) and via.dtype == np.float16
    np.testing.assert_array_equal(via, direct)
    view = _C.View.from_dlpack(DLPackOnly(q[:, ::2]), False)
    assert view.shape == [2, 9, 4, 64] and view.strides == [17 * 256, 2 * 256, 64, 1] and view.dtype == _C.F16


def test_bf16_through_dlpack():
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")  # NumPy's bfloat16, for the result
    q, k, v = (torch.randn(1, 19, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    out = flashattn.flash_attn_func(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v))
    assert out.dtype.name == "bfloat16"
    ref, _ = attention(*(x.double().numpy() for x in (q, k, v)))
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # standard attention in bf16, [b, h, s, d]
    plain = (torch.softmax(qh @ kh.transpose(-1, -2) * 64**-0.5, dim=-1) @ vh).transpose(1, 2)
    assert_rule(out.astype(np.float64), ref, plain.double().numpy(), "bfloat16")


def paged_cache(k_full, v_full, page_size, rng, spare_pages=3):
    """Scatters contiguous caches [b, cap, h, d] into shuffled pages (unused slots NaN) + block table."""
    b, cap, h, d = k_full.shape
    per_seq = cap // page_size
    num_pages = b * per_seq + spare_pages
    order = rng.permutation(num_pages)[: b * per_seq].reshape(b, per_seq).astype(np.int32)
    kc = np.full((num_pages, page_size, h, d), np.nan, dtype=k_full.dtype)
    vc = np.full_like(kc, np.nan)
    for i in range(b):
        for j in range(per_seq):
            kc[order[i, j]] = k_full[i, j * page_size:(j + 1) * page_size]
            vc[order[i, j]] = v_full[i, j * page_size:(j + 1) * page_size]
    return kc, vc, order


def gather(cache, table, length, page_size):
    rows = [cache[table[j // page_size], j % page_size] for j in range(length)]
    return np.stack(rows) if rows else np.zeros((0,) + cache.shape[2:], cache.dtype)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("append", [False, True])
def test_kvcache_matches_reference(paged, append):
    b, cap, hq, hk, d, s_new, page = 3, 64, 4, 2, 64, 2, 16
    lens = np.array([0, 37, 62 - s_new], dtype=np.int32)
    k_full, v_full = randn(b, cap, hk, d), randn(b, cap, hk, d)
    for i, n in enumerate(lens):  # slots past each sequence are never read: NaN shows any that is
        k_full[i, n:], v_full[i, n:] = np.nan, np.nan
    q = randn(b, s_new, hq, d)
    k_new, v_new = (randn(b, s_new, hk, d), randn(b, s_new, hk, d)) if append else (None, None)
    if paged:
        kc, vc, table = paged_cache(k_full, v_full, page, RNG)
    else:
        kc, vc, table = k_full.copy(), v_full.copy(), None
    before_k = kc.copy()
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                                 causal=True, num_splits=3, return_lse=True)
    for i in range(b):
        n = lens[i] + (s_new if append else 0)
        if paged:
            keys, vals = gather(kc, table[i], n, page), gather(vc, table[i], n, page)
        else:
            keys, vals = kc[i, :n], vc[i, :n]
        if append:  # the new tokens landed at cache_seqlens, nothing else changed
            np.testing.assert_array_equal(keys[lens[i]:], k_new[i])
            np.testing.assert_array_equal(vals[lens[i]:], v_new[i])
        ref_o, ref_l = attention(q[i:i + 1], keys[None], vals[None], causal=True)
        plain_o, _ = attention(q[i:i + 1], keys[None], vals[None], causal=True, dtype=np.float32)
        assert_rule(out[i:i + 1], ref_o, plain_o, "float32")
        assert max_err(lse[i:i + 1], ref_l) < 1e-4
    changed = np.any(~((kc == before_k) | (np.isnan(kc) & np.isnan(before_k))), axis=(-1, -2))
    assert changed.sum() == (b * s_new if append else 0)


def test_planned_decode_through_the_binding():
    # The plan path (what CUDA-graph capture runs on the GPU) through the same binding, on host
    # arrays: a plan for longer lengths than now runs the same step, and a plan made for another
    # problem shape is refused.
    from flashattn._arrays import view
    q, kc, vc = randn(2, 1, 4, 64), randn(2, 40, 2, 64), randn(2, 40, 2, 64)
    lens = np.array([7, 30], dtype=np.int32)
    out, lse = np.empty_like(q), np.empty((2, 4, 1), dtype=np.float32)
    args = [view(q, "q"), view(kc, "k_cache"), view(vc, "v_cache"), None, view(lens, "cache_seqlens"), None, None,
            view(out, "out", writable=True), view(lse, "lse", writable=True)]
    opts = dict(num_splits=0, softmax_scale=0.0, causal=True, window_left=-1, window_right=-1, softcap=0.0,
                num_threads=0, stream=0)
    plan = _C.plan_decode(*args, **opts, max_cache_seqlen=40)
    assert plan.max_cache_seqlen == 40
    _C.decode(*args, **opts, plan=plan)
    ref, _ = attention(q[1:], kc[1:, :30], vc[1:, :30], causal=True)
    assert max_err(out[1:], ref) < 1e-5
    planned = out.copy()
    _C.decode(*args, **opts)
    np.testing.assert_array_equal(out, planned)
    with pytest.raises(ValueError, match=r"max_cache_seqlen.*must be 0"):
        _C.plan_decode(*args, **opts, max_cache_seqlen=41)
    q3 = randn(3, 1, 4, 64)
    args3 = [view(q3, "q"), view(randn(3, 40, 2, 64), "k_cache"), view(randn(3, 40, 2, 64), "v_cache"), None,
             view(np.array([1, 2, 3], dtype=np.int32), "cache_seqlens"), None, None,
             view(np.empty_like(q3), "out", writable=True), None]
    with pytest.raises(ValueError, match=r"argument 'plan': was made for batch 2, but the arguments have 3"):
        _C.decode(*args3, **opts, plan=plan)


def test_kvcache_int_seqlens_and_whole_cache():
    q, kc, vc = randn(2, 1, 2, 32), randn(2, 24, 2, 32), randn(2, 24, 2, 32)
    whole = flashattn.flash_attn_with_kvcache(q, kc, vc)
    ref, _ = attention(q, kc, vc)
    assert max_err(whole, ref) < 1e-5
    part = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=10)
    ref, _ = attention(q, kc[:, :10], vc[:, :10])
    assert max_err(part, ref) < 1e-5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merge_states_reassembles_full_attention(dtype):
    q, k, v = randn(2, 9, 4, 64, dtype=dtype), randn(2, 30, 4, 64, dtype=dtype), randn(2, 30, 4, 64, dtype=dtype)
    # Three disjoint key sets; the last is empty for every row (lse = -inf weighs nothing).
    cuts = [(0, 12), (12, 30), (30, 30)]
    outs, lses = [], []
    lse_dtype = np.float64 if dtype == np.float64 else np.float32
    for a, z in cuts:
        if z > a:
            o, part_lse = flashattn.flash_attn_func(q, k[:, a:z], v[:, a:z], return_lse=True)
        else:
            o, part_lse = np.zeros_like(q), np.full((2, 4, 9), -np.inf, dtype=lse_dtype)
        outs.append(o.reshape(18, 4, 64))
        lses.append(part_lse.transpose(0, 2, 1).reshape(18, 4))
    out, lse = flashattn.merge_states(np.stack(outs), np.stack(lses))
    ref_o, ref_l = attention(q, k, v)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    assert max_err(out, ref_o.reshape(18, 4, 64)) < tol
    assert max_err(lse, ref_l.transpose(0, 2, 1).reshape(18, 4)) < tol


# ---- errors: the library's message, as the matching Python exception -----------------------------

def test_bad_head_dim_is_a_value_error_naming_the_argument():
    q = randn(1, 4, 2, 30)
    with pytest.raises(ValueError, match=r"forward: argument 'q': head_dim must be a multiple of 8"):
        flashattn.flash_attn_func(q, q, q)


def test_mismatched_dtype_and_shape():
    q, k = randn(1, 4, 2, 32), randn(1, 4, 2, 32, dtype=np.float64)
    with pytest.raises(ValueError, match=r"argument 'k': expected dtype f32, got f64"):
        flashattn.flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match=r"argument 'k': heads_q \(2\) must be a positive multiple of heads_kv \(3\)"):
        flashattn.flash_attn_func(q, randn(1, 4, 3, 32), randn(1, 4, 3, 32))
    with pytest.raises(ValueError, match=r"q: expected rank 4"):
        flashattn.flash_attn_func(randn(4, 2, 32), k, k)


def test_bad_options():
    q = randn(1, 4, 2, 32)
    with pytest.raises(ValueError, match=r"window_size"):
        flashattn.flash_attn_func(q, q, q, window_size=3)
    with pytest.raises(ValueError, match=r"options.window_left.*must be >= -1"):
        flashattn.flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match=r"options.window_right.*when causal"):
        flashattn.flash_attn_func(q, q, q, causal=True, window_size=(-1, 2))
    with pytest.raises(ValueError, match=r"options.softcap"):
        flashattn.flash_attn_func(q, q, q, softcap=-1.0)
    with pytest.raises(ValueError, match=r"softmax_scale"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=0.0)
    with pytest.raises(NotImplementedError, match=r"no dropout"):
        flashattn.flash_attn_func(q, q, q, dropout_p=0.1)


def test_bad_inputs():
    q = randn(1, 4, 2, 32)
    with pytest.raises(ValueError, match=r"NumPy dtype int64 is not supported"):
        flashattn.flash_attn_func(q.astype(np.int64), q, q)
    with pytest.raises(ValueError, match=r"q: byte order '>' is not this machine's"):
        flashattn.flash_attn_func(q.astype(">f4"), q, q)
    with pytest.raises(TypeError, match=r"expected a torch tensor, a NumPy array or a DLPack producer, got list"):
        flashattn.flash_attn_func(q.tolist(), q, q)
    cu = np.array([0, 4], dtype=np.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q.*non-decreasing"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], np.array([0, 3, 2], dtype=np.int32),
                                         np.array([0, 2, 4], dtype=np.int32), 3, 2)
    with pytest.raises(ValueError, match=r"cu_seqlens_k.*expected dtype i32, got f32"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu.astype(np.float32), 4, 4)


def test_kvcache_errors():
    q, kc = randn(2, 1, 2, 32), randn(2, 8, 2, 32)
    with pytest.raises(ValueError, match=r"argument 'cache_seqlens': entry 1 \(9\) exceeds the cache capacity of 8"):
        flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), cache_seqlens=np.array([1, 9], dtype=np.int32))
    with pytest.raises(ValueError, match=r"read-only"):
        ro = kc.copy()
        ro.flags.writeable = False
        flashattn.flash_attn_with_kvcache(q, ro, kc.copy(), randn(2, 1, 2, 32), randn(2, 1, 2, 32), cache_seqlens=1)
    with pytest.raises(ValueError, match=r"needs both k and v"):
        flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), k=randn(2, 1, 2, 32), cache_seqlens=1)
    with pytest.raises(ValueError, match=r"block_table.*is not a page id"):
        flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), cache_seqlens=np.array([3, 3], dtype=np.int32),
                                          block_table=np.array([[0], [5]], dtype=np.int32))


@pytest.mark.skipif(flashattn.build_info()["cuda_compiled"], reason="this build has CUDA kernels")
def test_cuda_views_without_cuda_are_not_implemented():
    # A view that claims CUDA memory passes validation and reaches the (absent) CUDA backend: the
    # library's `unsupported` status becomes NotImplementedError with its message.
    def cuda(address, shape):
        strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
        return _C.View.raw(address, _C.F16, _C.CUDA, 0, shape, strides)

    q = cuda(0x10000, [1, 4, 2, 32])
    with pytest.raises(NotImplementedError, match=r"built without CUDA"):
        _C.forward(q, q, q, cuda(0x20000, [1, 4, 2, 32]), None, None, None, softmax_scale=0.0, causal=False,
                   window_left=-1, window_right=-1, softcap=0.0, num_threads=0, stream=0)


def test_last_gpu_kernel_is_empty_after_cpu_calls():
    # Only GPU forward/backward calls set it; a thread that made none reports "".
    q = randn(1, 8, 2, 32)
    flashattn.flash_attn_func(q, q, q)
    assert flashattn.last_gpu_kernel() == ""
