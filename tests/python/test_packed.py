"""FlashAttention's packed entry points (qkv or kv in one tensor): the same results as the unpacked
calls on the same values, gradients back into the packed tensor, and errors naming the argument."""
import numpy as np
import pytest

import flashattn

RNG = np.random.default_rng(11)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("opts", [dict(), dict(causal=True, softcap=3.0), dict(window_size=(7, 2))])
def test_qkvpacked_matches_unpacked(opts):
    qkv = randn(2, 37, 3, 4, 64)
    out, lse = flashattn.flash_attn_qkvpacked_func(qkv, return_lse=True, **opts)
    q, k, v = (np.ascontiguousarray(qkv[:, :, i]) for i in range(3))
    want_out, want_lse = flashattn.flash_attn_func(q, k, v, return_lse=True, **opts)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)


def test_qkvpacked_gqa_packing_by_heads():
    # FlashAttention-3's layout: 6 query heads, then 2 K heads, then 2 V heads.
    qkv = randn(1, 29, 10, 32)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=6)
    q, k, v = (np.ascontiguousarray(x) for x in (qkv[:, :, :6], qkv[:, :, 6:8], qkv[:, :, 8:]))
    np.testing.assert_array_equal(out, flashattn.flash_attn_func(q, k, v, causal=True))
    assert out.shape == (1, 29, 6, 32)


def test_kvpacked_matches_unpacked():
    q, kv = randn(2, 21, 4, 64), randn(2, 45, 2, 2, 64)
    out = flashattn.flash_attn_kvpacked_func(q, kv, causal=True)
    k, v = (np.ascontiguousarray(kv[:, :, i]) for i in range(2))
    np.testing.assert_array_equal(out, flashattn.flash_attn_func(q, k, v, causal=True))


def test_varlen_packed_match_unpacked():
    cu = np.array([0, 5, 5, 17], dtype=np.int32)  # an empty sequence in the middle
    qkv = randn(17, 3, 2, 32)
    out = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 12, causal=True)
    q, k, v = (np.ascontiguousarray(qkv[:, i]) for i in range(3))
    np.testing.assert_array_equal(out, flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True))
    gqa = randn(17, 4 + 2 * 2, 32)
    out = flashattn.flash_attn_varlen_qkvpacked_func(gqa, cu, 12, num_heads_q=4)
    q, k, v = (np.ascontiguousarray(x) for x in (gqa[:, :4], gqa[:, 4:6], gqa[:, 6:]))
    np.testing.assert_array_equal(out, flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12))
    cu_k = np.array([0, 9, 10, 30], dtype=np.int32)
    q, kv = randn(17, 4, 64), randn(30, 2, 2, 64)
    out = flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 12, 20, window_size=(4, 4))
    k, v = (np.ascontiguousarray(kv[:, i]) for i in range(2))
    np.testing.assert_array_equal(out, flashattn.flash_attn_varlen_func(q, k, v, cu, cu_k, 12, 20,
                                                                       window_size=(4, 4)))


def test_packed_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"qkv: expected \[batch, seqlen, 3, heads, head_dim\]"):
        flashattn.flash_attn_qkvpacked_func(randn(2, 8, 4, 2, 32))
    with pytest.raises(ValueError, match=r"qkv: expected \[total, 3, heads, head_dim\]"):
        flashattn.flash_attn_varlen_qkvpacked_func(randn(2, 8, 3, 2, 32), np.array([0, 2], dtype=np.int32), 2)
    with pytest.raises(ValueError, match="kv: expected"):
        flashattn.flash_attn_kvpacked_func(randn(2, 8, 2, 32), randn(2, 8, 2, 32))
    with pytest.raises(ValueError, match="num_heads_q"):
        flashattn.flash_attn_qkvpacked_func(randn(1, 8, 7, 32), num_heads_q=4)  # 3 heads left: not K and V
    with pytest.raises(ValueError, match="num_heads_q"):
        flashattn.flash_attn_qkvpacked_func(randn(1, 8, 8, 32), num_heads_q=2.0)
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn.flash_attn_qkvpacked_func(randn(1, 8, 3, 2, 32), dropout_p=0.1)


def test_torch_gradient_lands_in_the_packed_tensor():
    torch = pytest.importorskip("torch")
    torch.manual_seed(3)
    qkv = torch.randn(2, 33, 3, 4, 64, requires_grad=True)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    grad = torch.randn_like(out)
    out.backward(grad)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    want = flashattn.flash_attn_func(q, k, v, causal=True)
    want.backward(grad)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2), rtol=0, atol=0)


def test_torch_gradcheck_gqa_packing():
    torch = pytest.importorskip("torch")
    qkv = torch.randn(1, 6, 4 + 2 * 2, 32, dtype=torch.float64, requires_grad=True)
    fn = lambda x: flashattn.flash_attn_qkvpacked_func(x, num_heads_q=4, softcap=2.0, return_lse=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (qkv,), eps=1e-6, atol=1e-7, fast_mode=True)
