"""torch tensors on the CPU: forward against the float64 reference, gradients (gradcheck in
float64), torch.compile, the operators' registrations, KV cache and merge, errors."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from reference import assert_rule, attention, max_err, visible  # noqa: E402
from ring import ring_attention  # noqa: E402

torch.manual_seed(0)


def rand(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def ref(q, k, v, **opts):
    return attention(q.detach().double().numpy(), k.detach().double().numpy(), v.detach().double().numpy(), **opts)


@pytest.mark.parametrize("dtype,name", [(torch.float32, "float32"), (torch.float16, "float16"),
                                        (torch.bfloat16, "bfloat16"), (torch.float64, "float64")])
@pytest.mark.parametrize("opts", [dict(), dict(causal=True, softcap=4.0), dict(window=(6, 2))])
def test_forward_matches_reference(dtype, name, opts):
    q, k, v = rand(2, 45, 4, 64, dtype=dtype), rand(2, 60, 1, 64, dtype=dtype), rand(2, 60, 1, 64, dtype=dtype)
    out, lse = flashattn.flash_attn_func(q, k, v, causal=opts.get("causal", False), softcap=opts.get("softcap", 0.0),
                                         window_size=opts.get("window", (-1, -1)), return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == (2, 4, 45)
    ref_o, ref_l = ref(q, k, v, **opts)
    # The same-precision standard attention: torch's own ops in `dtype`.
    qh, kh, vh = (x.transpose(1, 2).repeat_interleave(4 // x.shape[2], dim=1) for x in (q, k, v))
    s = (qh @ kh.transpose(-1, -2)) * 64**-0.5
    if opts.get("softcap"):
        s = opts["softcap"] * torch.tanh(s / opts["softcap"])
    mask = torch.from_numpy(~visible(45, 60, opts.get("causal", False), opts.get("window", (-1, -1))))
    plain = (torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ vh).transpose(1, 2)
    assert_rule(out.double().numpy(), ref_o, plain.double().numpy(), name)
    assert max_err(lse.double().numpy(), ref_l) < (1e-10 if dtype == torch.float64 else 2e-2)


def test_noncontiguous_torch_layouts():
    q = rand(2, 4, 33, 64).transpose(1, 2)  # [b, h, s, d] storage, as many models keep it
    kv = rand(2, 40, 2, 2, 64)
    k, v = kv[:, :, 0], kv[:, :, 1]
    head_major = rand(2, 33, 4, 64).transpose(-1, -2).contiguous().transpose(-1, -2)  # stride(-1) != 1: copied
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    ref_o, _ = ref(q, k, v, causal=True)
    assert max_err(out.double().numpy(), ref_o) < 1e-5
    out2 = flashattn.flash_attn_func(head_major, k, v)
    ref2, _ = ref(head_major, k, v)
    assert max_err(out2.double().numpy(), ref2) < 1e-5


# ---- gradients ----------------------------------------------------------------------------------

GRAD_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window_size=(2, 1)),
    "softcap": dict(softcap=1.5, softmax_scale=0.5),
    "causal-window-softcap": dict(causal=True, window_size=(3, 0), softcap=2.0),
}


# Fast mode compares the analytical and numerical Jacobians along random directions (a wrong entry
# shows with probability one); one case runs the full element-by-element check.
@pytest.mark.parametrize("case", GRAD_CASES, ids=list(GRAD_CASES))
@pytest.mark.parametrize("return_lse", [False, True])
def test_gradcheck(case, return_lse):
    # GQA throughout (4 query heads on 2 KV heads); seqlen_q < seqlen_k so every row sees a key.
    q, k, v = (rand(1, 5, 4, 32, dtype=torch.float64, grad=True), rand(1, 7, 2, 32, dtype=torch.float64, grad=True),
               rand(1, 7, 2, 32, dtype=torch.float64, grad=True))
    fn = lambda q, k, v: flashattn.flash_attn_func(q, k, v, return_lse=return_lse, **GRAD_CASES[case])  # noqa: E731
    full = case == "causal-window-softcap" and return_lse
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, fast_mode=not full)


@pytest.mark.parametrize("opts", [dict(), dict(causal=True, softcap=3.0)])
def test_gradcheck_varlen(opts):
    cu_q = torch.tensor([0, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 10], dtype=torch.int32)
    q, k, v = (rand(8, 2, 32, dtype=torch.float64, grad=True), rand(10, 1, 32, dtype=torch.float64, grad=True),
               rand(10, 1, 32, dtype=torch.float64, grad=True))
    fn = lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, return_lse=True, **opts)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, fast_mode=True)


def test_float32_gradients_within_the_rule_and_deterministic():
    q, k, v = rand(2, 70, 4, 64, grad=True), rand(2, 90, 2, 64, grad=True), rand(2, 90, 2, 64, grad=True)
    dout = torch.randn(2, 70, 4, 64)

    def grads(fn, *xs):
        xs = [x.detach().clone().requires_grad_() for x in xs]
        fn(*xs).backward(dout.to(xs[0].dtype))
        return [x.grad.double() for x in xs]

    def standard(q, k, v):  # autograd through plain attention, in the inputs' precision
        qh = q.transpose(1, 2)
        kh, vh = (x.transpose(1, 2).repeat_interleave(2, 1) for x in (k, v))
        s = (qh @ kh.transpose(-1, -2)) / 8
        s = s.masked_fill(torch.ones(70, 90, dtype=torch.bool).triu(90 - 70 + 1), float("-inf"))
        return (torch.softmax(s, -1) @ vh).transpose(1, 2)

    ours = grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True), q, k, v)
    again = grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True), q, k, v)
    ref64 = grads(standard, q.double(), k.double(), v.double())
    plain = grads(standard, q, k, v)
    for name, a, b, r, p in zip("qkv", ours, again, ref64, plain):
        assert torch.equal(a, b), f"d{name} differs between two runs"
        assert_rule(a.numpy(), r.numpy(), p.numpy(), "float32", factor=3.0, what=f"d{name}")


# ---- torch.compile and the operator registrations ------------------------------------------------

class AttentionBlock(torch.nn.Module):
    def __init__(self, dim=128, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.d)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.d).unbind(2)
        return self.o(flashattn.flash_attn_func(q, k, v, causal=True, window_size=(16, 0)).reshape(b, s, -1))


def test_torch_compile_fullgraph_traces_the_ops():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"fw": [], "bw": []}

    def recorder(kind):
        def compile_fn(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)
        return compile_fn

    torch._dynamo.reset()
    block = AttentionBlock()
    compiled = torch.compile(block, fullgraph=True, backend=aot_autograd(fw_compiler=recorder("fw"),
                                                                         bw_compiler=recorder("bw")))
    x = torch.randn(2, 40, 128, requires_grad=True)
    eager_out = block(x)
    eager_grads = torch.autograd.grad(eager_out.square().sum(), [x, *block.parameters()])
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *block.parameters()])
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)

    def count(gms, op):
        return sum(n.target == op for gm in gms for n in gm.graph.nodes)

    assert count(graphs["fw"], torch.ops.flashattn.fwd.default) == 1
    # Only `out` feeds the loss, so the backward is one bwd call (no lse term).
    assert count(graphs["bw"], torch.ops.flashattn.bwd.default) == 1


def test_torch_compile_of_a_decode_step_appends_like_eager():
    torch._dynamo.reset()
    kc, vc = rand(2, 32, 2, 64), rand(2, 32, 2, 64)
    lens = torch.tensor([5, 17], dtype=torch.int32)
    q, k_new, v_new = rand(2, 1, 4, 64), rand(2, 1, 2, 64), rand(2, 1, 2, 64)

    def step(q, kc, vc, k_new, v_new, lens):
        out = flashattn.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=True)
        return out * 2

    kc2, vc2 = kc.clone(), vc.clone()
    eager = step(q, kc, vc, k_new, v_new, lens)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kc2, vc2, k_new, v_new, lens)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    # The declared mutation reaches the caller's caches under torch.compile too.
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    assert torch.equal(kc[0, 5], k_new[0, 0]) and torch.equal(vc[1, 17], v_new[1, 0])


def test_eager_kvcache_step_skips_the_dispatch_only_where_nothing_needs_it():
    from torch._subclasses.fake_tensor import FakeTensorMode

    kc, vc = rand(2, 32, 2, 64), rand(2, 32, 2, 64)
    lens = torch.tensor([5, 17], dtype=torch.int32)
    q = rand(2, 1, 4, 64)
    # Eager on plain tensors: the implementation called directly gives the operator's result.
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, return_lse=True)
    op_out, op_lse = torch.ops.flashattn.kvcache(q, kc, vc, lens, None, 0.0, True, -1, -1, 0.0, 0)
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)
    # A profiler records the operator.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    assert any(e.name == "flashattn::kvcache" for e in prof.events())
    # A gradient asked for goes through the operator, whose missing autograd formula is reported.
    qg = q.clone().requires_grad_()
    out = flashattn.flash_attn_with_kvcache(qg, kc, vc, cache_seqlens=lens)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out.sum().backward()
    # Under a dispatch mode (fake tensors, as export traces) the operator's fake implementation runs.
    with FakeTensorMode() as mode:
        fake = flashattn.flash_attn_with_kvcache(mode.from_tensor(q), mode.from_tensor(kc), mode.from_tensor(vc),
                                                 cache_seqlens=mode.from_tensor(lens))
    assert type(fake).__name__ == "FakeTensor" and fake.shape == q.shape


def test_eager_forward_skips_the_dispatch_only_where_nothing_needs_it():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = rand(2, 7, 4, 64), rand(2, 9, 2, 64), rand(2, 9, 2, 64)
    # Eager on plain tensors without gradients: the implementation called directly gives the
    # operator's result, in the fixed-length and varlen forms.
    out, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    op_out, op_lse = torch.ops.flashattn.fwd(q, k, v, None, None, 0.0, True, -1, -1, 0.0, False)
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 9, 9], dtype=torch.int32)
    qv, kv, vv = q[0], k[0], v[0]
    var_out = flashattn.flash_attn_varlen_func(qv, kv, vv, cu_q, cu_k, 4, 9, causal=True)
    var_op_out, _ = torch.ops.flashattn.fwd(qv, kv, vv, cu_q, cu_k, 0.0, True, -1, -1, 0.0, False)
    assert torch.equal(var_out, var_op_out)
    # A profiler records the operator.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        flashattn.flash_attn_func(q, k, v)
    assert any(e.name == "flashattn::fwd" for e in prof.events())
    # A gradient asked for goes through the operator and its autograd formula.
    qg = q.clone().requires_grad_()
    grad_out = flashattn.flash_attn_func(qg, k, v, causal=True)
    assert grad_out.grad_fn is not None and torch.equal(grad_out.detach(), op_out)
    grad_out.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()
    # Under a dispatch mode (fake tensors, as export traces) the operator's fake implementation runs.
    with FakeTensorMode() as mode:
        fake = flashattn.flash_attn_func(mode.from_tensor(q), mode.from_tensor(k), mode.from_tensor(v))
    assert type(fake).__name__ == "FakeTensor" and fake.shape == q.shape


def test_opcheck_registrations():
    q, k, v = rand(1, 6, 2, 32, grad=True), rand(1, 9, 1, 32, grad=True), rand(1, 9, 1, 32, grad=True)
    opts = (0.0, True, -1, -1, 0.0, False)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, None, None, *opts))
    out, lse = torch.ops.flashattn.fwd(q, k, v, None, None, *opts)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None,
                           None, *opts))
    kc, vc = rand(4, 8, 1, 32), rand(4, 8, 1, 32)
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    lens = torch.tensor([5, 11], dtype=torch.int32)
    dec = (0.0, True, -1, -1, 0.0, 0)
    torch.library.opcheck(torch.ops.flashattn.kvcache.default, (rand(2, 1, 2, 32), kc, vc, lens, table, *dec))
    torch.library.opcheck(torch.ops.flashattn.kvcache_append.default,
                          (rand(2, 1, 2, 32), kc, vc, rand(2, 1, 1, 32), rand(2, 1, 1, 32), lens, table, *dec))
    torch.library.opcheck(torch.ops.flashattn.merge.default, (rand(3, 5, 2, 32), rand(3, 5, 2)))


def test_meta_tensors_give_shapes():
    q, k = torch.empty(2, 10, 8, 64, device="meta"), torch.empty(2, 20, 2, 64, device="meta")
    out, lse = flashattn.flash_attn_func(q, k, k, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 8, 10) and lse.dtype == torch.float32
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    out, lse = flashattn.flash_attn_with_kvcache(q[:, :1], k, k, cache_seqlens=lens, return_lse=True)
    assert out.shape == (2, 1, 8, 64) and lse.shape == (2, 8, 1)


# ---- KV cache and merge -------------------------------------------------------------------------

def test_paged_kvcache_with_append():
    b, page, hq, hk, d = 2, 8, 4, 2, 64
    num_pages, per_seq = 7, 3
    kc, vc = torch.full((num_pages, page, hk, d), float("nan")), torch.full((num_pages, page, hk, d), float("nan"))
    table = torch.tensor([[4, 0, 6], [2, 5, 1]], dtype=torch.int32)
    lens = torch.tensor([9, 20], dtype=torch.int32)
    keys, vals = rand(b, per_seq * page, hk, d), rand(b, per_seq * page, hk, d)
    for i in range(b):
        for j in range(per_seq):
            n = min(max(int(lens[i]) - j * page, 0), page)  # only the filled slots; the rest stay NaN
            kc[table[i, j], :n] = keys[i, j * page:j * page + n]
            vc[table[i, j], :n] = vals[i, j * page:j * page + n]
    q, k_new, v_new = rand(b, 3, hq, d), rand(b, 3, hk, d), rand(b, 3, hk, d)
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                            causal=True)
    for i in range(b):
        n = int(lens[i])
        ks = torch.cat([keys[i, :n], k_new[i]])[None]
        vs = torch.cat([vals[i, :n], v_new[i]])[None]
        ref_o, _ = ref(q[i:i + 1], ks, vs, causal=True)
        assert max_err(out[i:i + 1].double().numpy(), ref_o) < 1e-5
        pos = torch.arange(n, n + 3)
        torch.testing.assert_close(kc[table[i, pos // page].long(), pos % page], k_new[i], rtol=0, atol=0)
        torch.testing.assert_close(vc[table[i, pos // page].long(), pos % page], v_new[i], rtol=0, atol=0)


def test_merge_states_torch():
    q, k, v = rand(1, 6, 2, 32), rand(1, 20, 2, 32), rand(1, 20, 2, 32)
    parts = [flashattn.flash_attn_func(q, k[:, a:z], v[:, a:z], return_lse=True) for a, z in ((0, 7), (7, 20))]
    o_parts = torch.stack([o.reshape(6, 2, 32) for o, _ in parts])
    lse_parts = torch.stack([lse.transpose(1, 2).reshape(6, 2) for _, lse in parts])
    out, lse = flashattn.merge_states(o_parts, lse_parts)
    ref_o, ref_l = ref(q, k, v)
    assert max_err(out.double().numpy(), ref_o.reshape(6, 2, 32)) < 1e-5
    assert max_err(lse.double().numpy(), ref_l.transpose(0, 2, 1).reshape(6, 2)) < 1e-5


def test_merge_states_gradients():
    # gradcheck in float64 (finite lse: a -inf one has no finite difference), for out and lse.
    o_parts = rand(3, 5, 2, 16, dtype=torch.float64, grad=True)
    lse_parts = (3 * torch.randn(3, 5, 2, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(flashattn.merge_states, (o_parts, lse_parts))
    # An empty part (lse = -inf) weighs nothing and gets zero gradients, even with NaN in its o; a
    # row where every part is empty gets zero gradients too, never NaN.
    o = rand(2, 3, 1, 8)
    lse = torch.randn(2, 3, 1)
    o[1, 0], lse[1, 0] = float("nan"), float("-inf")
    o[:, 2], lse[:, 2] = float("nan"), float("-inf")
    o.requires_grad_(), lse.requires_grad_()
    out, merged = flashattn.merge_states(o, lse)
    (out.sum() + merged[:, :2].sum()).backward()
    assert torch.isfinite(o.grad).all() and torch.isfinite(lse.grad).all()
    assert (o.grad[1, 0] == 0).all() and lse.grad[1, 0] == 0 and (o.grad[:, 2] == 0).all() and (lse.grad[:, 2] == 0).all()
    torch.testing.assert_close(o.grad[0, 0], torch.ones(1, 8))  # the only live part of row 0 weighs 1
    torch.library.opcheck(torch.ops.flashattn.merge.default,
                          (rand(3, 5, 2, 32, grad=True), rand(3, 5, 2, grad=True)))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_autograd(dtype, tol, causal):
    # Ring attention (context parallelism) in plain autograd (ring.py): forward and gradients equal
    # the whole sequence's; the lse gradient of each pair carries the merge's share.
    b, c, hq, hk, d, n = 2, 13, 4, 2, 32, 3
    q, k, v = (rand(b, n * c, h, d, dtype=dtype, grad=True) for h in (hq, hk, hk))
    dout = rand(b, n * c, hq, d, dtype=dtype)
    ring = ring_attention(q, k, v, n, causal)
    ring_grads = torch.autograd.grad(ring, (q, k, v), dout)
    full = flashattn.flash_attn_func(q, k, v, causal=causal)
    full_grads = torch.autograd.grad(full, (q, k, v), dout)
    torch.testing.assert_close(ring, full, rtol=0, atol=tol)
    for got, want in zip(ring_grads, full_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=10 * tol)


# ---- errors -------------------------------------------------------------------------------------

def test_torch_errors():
    q = rand(1, 8, 2, 32)
    cu = torch.tensor([0, 8], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: dtype torch.int64 is not supported"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8)
    with pytest.raises(ValueError, match=r"forward: argument 'v': expected shape"):
        flashattn.flash_attn_func(q, q, rand(1, 8, 2, 64))
    with pytest.raises(ValueError, match=r"expected a floating dtype"):
        flashattn.flash_attn_func(q.to(torch.int32), q.to(torch.int32), q.to(torch.int32))
    with pytest.raises(ValueError, match=r"q: expected rank 4"):
        flashattn.flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(ValueError, match=r"decode: argument 'block_table'"):
        flashattn.flash_attn_with_kvcache(q[:, :1], q, q, cache_seqlens=4,
                                          block_table=torch.tensor([[0]], dtype=torch.float32))


def test_numpy_and_torch_agree():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 12, 2, 32)).astype(np.float32) for _ in range(3))
    a = flashattn.flash_attn_func(q, k, v, softcap=2.0)
    b = flashattn.flash_attn_func(*(torch.from_numpy(x) for x in (q, k, v)), softcap=2.0)
    np.testing.assert_array_equal(a, b.numpy())
