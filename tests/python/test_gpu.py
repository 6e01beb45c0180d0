"""CUDA tensors on the GPU kernels, against PyTorch standard attention under the accuracy rule:
max |ours - ref64| <= factor x max |plain - ref64| + atol, where ref64 is standard attention in
float64 and plain the same in the inputs' precision (factor 2 for outputs, 3 for gradients).

Skipped, with the reason, where there is no CUDA device or the build has no CUDA kernels. An
operation the library does not offer on the GPU yet is skipped with the library's own message."""
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from reference import ATOL  # noqa: E402
from ring import ring_attention  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if not flashattn.build_info()["cuda_compiled"]:
    pytest.skip("this flashattn was built without CUDA kernels (FLASHATTN_CUDA=OFF, or no nvcc)",
                allow_module_level=True)

DEV = "cuda"
NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def or_skip_unsupported(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        pytest.skip(f"library: {e}")


def standard(q, k, v, causal=False, window=(-1, -1), softcap=0.0, dtype=None, with_lse=False):
    """Standard attention over [b, s, h, d] in `dtype` (default: the inputs'), masks bottom-right;
    with_lse adds the logsumexp of the masked scores, [b, h, s]."""
    dtype = dtype or q.dtype
    q, k, v = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    sq, sk = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) * float(torch.tensor(q.shape[-1] ** -0.5, dtype=torch.float32))
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    hidden = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        hidden |= j < i - left
    if right >= 0:
        hidden |= j > i + right
    s = s.masked_fill(hidden, float("-inf"))
    out = (torch.softmax(s, dim=-1).nan_to_num(0.0) @ v).transpose(1, 2)  # empty rows give 0
    return (out, torch.logsumexp(s, dim=-1)) if with_lse else out


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def assert_rule(ours, ref64, plain, dtype, factor=2.0, what="out"):
    e, base = err(ours, ref64), err(plain, ref64)
    bound = factor * base + ATOL[NAMES[dtype]]
    assert e <= bound, f"{what}: max error {e:.3g} exceeds {factor} x plain error {base:.3g} + atol"


CASES = [dict(), dict(causal=True), dict(window=(128, 64)), dict(causal=True, softcap=30.0)]
SHAPES = [(1, 239), (113, 203), (512, 512), (1000, 1024)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("opts", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_forward(dtype, d, sq, sk, opts):
    q = torch.randn(2, sq, 8, d, device=DEV, dtype=dtype)
    k, v = (torch.randn(2, sk, 2, d, device=DEV, dtype=dtype) for _ in range(2))
    out = flashattn.flash_attn_func(q, k, v, causal=opts.get("causal", False), window_size=opts.get("window", (-1, -1)),
                                    softcap=opts.get("softcap", 0.0))
    assert_rule(out, standard(q, k, v, dtype=torch.float64, **opts), standard(q, k, v, **opts), dtype)
    assert flashattn.last_gpu_kernel().startswith("fwd "), flashattn.last_gpu_kernel()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_forward_varlen(dtype):
    lens_q, lens_k = [300, 1, 77, 0], [500, 64, 77, 9]
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEV)
    cu_k = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEV)
    q = torch.randn(sum(lens_q), 4, 128, device=DEV, dtype=dtype)
    k, v = (torch.randn(sum(lens_k), 4, 128, device=DEV, dtype=dtype) for _ in range(2))
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    for b in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
        if q1 == q0:
            continue
        args = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
        assert_rule(out[None, q0:q1], standard(*args, causal=True, dtype=torch.float64), standard(*args, causal=True),
                    dtype, what=f"out of sequence {b}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("opts", CASES[:3], ids=["plain", "causal", "window"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward(dtype, d, opts, deterministic):
    q = torch.randn(2, 333, 8, d, device=DEV, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 401, 2, d, device=DEV, dtype=dtype, requires_grad=True) for _ in range(2))
    dout = torch.randn_like(q)
    out = flashattn.flash_attn_func(q, k, v, causal=opts.get("causal", False), window_size=opts.get("window", (-1, -1)),
                                    deterministic=deterministic)
    ours = or_skip_unsupported(torch.autograd.grad, out, (q, k, v), dout)
    ref64 = torch.autograd.grad(standard(q, k, v, dtype=torch.float64, **opts), (q, k, v), dout.double())
    plain = torch.autograd.grad(standard(q, k, v, **opts), (q, k, v), dout)
    for name, a, r, p in zip("qkv", ours, ref64, plain):
        assert_rule(a, r, p, dtype, factor=3.0, what=f"d{name}")
    if deterministic:
        again = torch.autograd.grad(flashattn.flash_attn_func(q, k, v, causal=opts.get("causal", False),
                                                              window_size=opts.get("window", (-1, -1)),
                                                              deterministic=True), (q, k, v), dout)
        for name, a, b in zip("qkv", ours, again):
            assert torch.equal(a, b), f"d{name} differs between two deterministic runs"


def test_backward_through_lse():
    # The lse output is differentiable too: loss = <out, dout> + <lse, dlse>.
    dtype = torch.bfloat16
    q = torch.randn(2, 200, 8, 128, device=DEV, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 260, 2, 128, device=DEV, dtype=dtype, requires_grad=True) for _ in range(2))
    dout, dlse = torch.randn_like(q), torch.randn(2, 8, 200, device=DEV)

    def grads(out, lse):
        return torch.autograd.grad((out.float() * dout.float()).sum() + (lse.float() * dlse).sum(), (q, k, v))

    ours = or_skip_unsupported(grads, *flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True))
    ref64 = grads(*standard(q, k, v, causal=True, dtype=torch.float64, with_lse=True))
    plain = grads(*standard(q, k, v, causal=True, with_lse=True))
    for name, a, r, p in zip("qkv", ours, ref64, plain):
        assert_rule(a, r, p, dtype, factor=3.0, what=f"d{name}")


def paged_kv(b, pages_per_seq, page, hk, d, dtype):
    num_pages = b * pages_per_seq + 5
    kc = torch.randn(num_pages, page, hk, d, device=DEV, dtype=dtype)
    vc = torch.randn_like(kc)
    table = torch.randperm(num_pages, device=DEV)[: b * pages_per_seq].view(b, pages_per_seq).to(torch.int32)
    return kc, vc, table


def gathered(cache, table, n):
    page = cache.shape[1]
    pos = torch.arange(n, device=DEV)
    return cache[table[pos // page].long(), pos % page]


def check_decode(out, q, kc, vc, table, lens, k_new, v_new):
    """out of a causal step over paged caches: each sequence against standard attention over its
    lens[i] cached tokens (+ the appended ones, which must now be in the cache)."""
    s_new = q.shape[1]
    for i in range(q.shape[0]):
        n = lens[i].item() + (s_new if k_new is not None else 0)
        keys, vals = gathered(kc, table[i], n)[None], gathered(vc, table[i], n)[None]
        if k_new is not None:
            assert torch.equal(keys[0, -s_new:], k_new[i]) and torch.equal(vals[0, -s_new:], v_new[i])
        args = (q[i:i + 1], keys, vals)
        assert_rule(out[i:i + 1], standard(*args, causal=True, dtype=torch.float64), standard(*args, causal=True),
                    q.dtype, what=f"out of sequence {i}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("append", [False, True])
def test_kvcache_paged(dtype, append):
    b, hq, hk, d, page, s_new = 4, 32, 8, 128, 64, 1
    kc, vc, table = paged_kv(b, 40, page, hk, d, dtype)
    lens = torch.tensor([0, 1, 1000, 2500], dtype=torch.int32, device=DEV)
    q = torch.randn(b, s_new, hq, d, device=DEV, dtype=dtype)
    k_new, v_new = ((torch.randn(b, s_new, hk, d, device=DEV, dtype=dtype) for _ in range(2)) if append
                    else (None, None))
    out = or_skip_unsupported(flashattn.flash_attn_with_kvcache, q, kc, vc, k_new, v_new, cache_seqlens=lens,
                              block_table=table, causal=True)
    check_decode(out, q, kc, vc, table, lens, k_new, v_new)


def test_qkvpacked_reads_in_place_and_returns_a_packed_gradient():
    # 16-byte rows at every head offset of the packed tensor (d = 64, 16-bit): the GPU path reads the
    # three views in place; the results and gradients are those of the unpacked call, bit for bit
    # in deterministic mode.
    qkv = torch.randn(2, 257, 8 + 2 * 2, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=8, deterministic=True)
    dout = torch.randn_like(out)
    (dqkv,) = or_skip_unsupported(torch.autograd.grad, out, (qkv,), dout)
    q, k, v = (x.detach().clone().requires_grad_() for x in (qkv[:, :, :8], qkv[:, :, 8:10], qkv[:, :, 10:]))
    want = flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert torch.equal(out, want)
    grads = torch.autograd.grad(want, (q, k, v), dout)
    assert torch.equal(dqkv, torch.cat(grads, dim=2))


def test_merge_states():
    q = torch.randn(1, 50, 8, 128, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 700, 8, 128, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    parts = [flashattn.flash_attn_func(q, k[:, a:z], v[:, a:z], return_lse=True) for a, z in ((0, 300), (300, 700))]
    o_parts = torch.stack([o.reshape(50, 8, 128) for o, _ in parts])
    lse_parts = torch.stack([lse.transpose(1, 2).reshape(50, 8) for _, lse in parts])
    out, _ = or_skip_unsupported(flashattn.merge_states, o_parts, lse_parts)
    assert_rule(out.view(1, 50, 8, 128), standard(q, k, v, dtype=torch.float64), standard(q, k, v), torch.bfloat16)


@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_autograd(causal):
    # Ring attention in plain autograd (ring.py; test_torch_cpu.py has the float64 version): the
    # gradients flow through merge_states' autograd into each pair's out and lse.
    dtype, b, c, n, hq, hk, d = torch.bfloat16, 2, 200, 3, 8, 2, 128
    q = torch.randn(b, n * c, hq, d, device=DEV, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, n * c, hk, d, device=DEV, dtype=dtype, requires_grad=True) for _ in range(2))
    dout = torch.randn_like(q)
    out = or_skip_unsupported(ring_attention, q, k, v, n, causal)
    ours = or_skip_unsupported(torch.autograd.grad, out, (q, k, v), dout)
    ref64 = standard(q, k, v, causal=causal, dtype=torch.float64)
    plain = standard(q, k, v, causal=causal)
    assert_rule(out, ref64, plain, dtype)
    grads64 = torch.autograd.grad(ref64, (q, k, v), dout.double())
    grads_plain = torch.autograd.grad(plain, (q, k, v), dout)
    for name, a, r, p in zip("qkv", ours, grads64, grads_plain):
        assert_rule(a, r, p, dtype, factor=3.0, what=f"d{name}")


def test_cuda_graph_capture_of_a_decode_step():
    b, hq, hk, d, page = 8, 32, 8, 128, 64
    kc, vc, table = paged_kv(b, 16, page, hk, d, torch.bfloat16)
    lens = torch.randint(1, 900, (b,), dtype=torch.int32, device=DEV)
    q = torch.randn(b, 1, hq, d, device=DEV, dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(b, 1, hk, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))

    def step():
        return flashattn.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                                 causal=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capturing stream, as torch.cuda.graph expects
        or_skip_unsupported(step)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    # The next step: new query and tokens, lengths grown by one, written into the captured buffers.
    q.copy_(torch.randn_like(q))
    k_new.copy_(torch.randn_like(k_new))
    v_new.copy_(torch.randn_like(v_new))
    lens += 1
    graph.replay()
    torch.cuda.synchronize()
    check_decode(captured, q, kc, vc, table, lens, k_new, v_new)
