"""FlashAttention's Python functions over this library.

Layouts are FlashAttention's: q [batch, seqlen_q, heads_q, d], k and v [batch, seqlen_k, heads_kv, d]
(heads_q a multiple of heads_kv: MQA/GQA); varlen packs the sequences as [total, heads, d] with
int32 cu_seqlens [batch + 1]. lse is [batch, heads_q, seqlen_q] (varlen [heads_q, total_q]), float32
(float64 for float64 inputs).

Semantics (the library's, see flashattn.hpp): scores are softmax_scale * q.k (default
1/sqrt(d)), then softcap * tanh(s / softcap) when softcap > 0, then masks. causal and
window_size = (left, right) are aligned bottom-right: query i of seqlen_q sees key j of seqlen_k iff
i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, -1 meaning unbounded;
causal sets right = 0. A row that sees no key gives out = 0 and lse = -inf.

torch tensors run through the torch.ops.flashattn operators (autograd, torch.compile, the current
CUDA stream; an eager KV-cache step on plain tensors calls its operator's implementation directly);
NumPy arrays and other DLPack producers run on the CPU engine without autograd and return NumPy
arrays.

Errors: a bad argument raises ValueError, something valid that this build or device does not offer
raises NotImplementedError, and CUDA failures raise RuntimeError, each with the library's message.
"""
import numbers

from . import _arrays

try:
    import torch
except ImportError:  # torch is optional: NumPy arrays need only the extension
    torch = None
else:
    from . import _torch_ops  # registers torch.ops.flashattn.*


def _is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def _undispatched(*tensors):
    """Whether a forward or a KV-cache step may call its operator's implementation directly instead
    of through torch.ops: in eager mode, on plain CPU or CUDA tensors (meta tensors take the fake
    implementation), outside every torch function and dispatch mode (FakeTensorMode, export's
    tracing), with no profiler recording (it names the operator) and no gradient asked for (the
    forward's gradient comes from its operator's autograd formula; the decode operators have none,
    and through them a backward raises, while a direct call's output would silently carry no
    gradient). The dispatch took 14 of the 61 us of a decode call at 16 cached keys on a 2-core VM,
    where the library's own work took 19, and 13 of the 43 us of an f32 forward of 8 heads x 16
    tokens."""
    if (torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
            or torch._C._len_torch_dispatch_stack() or torch.autograd._profiler_enabled()):
        return False
    grad = torch.is_grad_enabled()
    return all(t is None or (type(t) is torch.Tensor and (t.is_cpu or t.is_cuda) and not (grad and t.requires_grad))
               for t in tensors)


def _torch_forward(args, return_lse, deterministic):
    """flashattn::fwd's arguments (q, k, v, cu_seqlens_q, cu_seqlens_k, then the options) through its
    implementation directly where no dispatch is needed (without lse unless asked for), else
    through the operator."""
    if _undispatched(*args[:5]):
        return _torch_ops.forward_step(*args, with_lse=bool(return_lse))
    return _torch_ops.fwd(*args, bool(deterministic))


def _window(window_size):
    if type(window_size) is tuple and len(window_size) == 2 and type(window_size[0]) is int and \
            type(window_size[1]) is int:
        return window_size  # the usual call, without the numbers.Integral checks (an ABC test per value)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected (left, right), got {window_size!r}") from None
    if not isinstance(left, numbers.Integral) or not isinstance(right, numbers.Integral):
        raise ValueError(f"window_size: expected two ints (-1 = unbounded), got {window_size!r}")
    return int(left), int(right)


def _scale(softmax_scale):
    # 0 tells the library to use 1/sqrt(head_dim); a caller's 0 or negative scale is its error to report.
    if softmax_scale is None:
        return 0.0
    if float(softmax_scale) <= 0.0:
        raise ValueError(f"softmax_scale: must be > 0 (None = 1/sqrt(head_dim)), got {softmax_scale}")
    return float(softmax_scale)


def _no_dropout(dropout_p):
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: flashattn computes exact attention and has no dropout")


def _unit_last_dim(t):
    # The library takes any strides but needs the head dimension contiguous, as FlashAttention does.
    return t if t.stride(-1) == 1 else t.contiguous()


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, return_lse=False,
                    deterministic=False, *, dropout_p=0.0):
    """Attention over a batch of equal-length sequences; returns out, or (out, lse) with return_lse.

    deterministic: a fixed accumulation order in the GPU backward (the CPU backward always has one).
    dropout_p: accepted for FlashAttention call sites; only 0 is supported.
    """
    _no_dropout(dropout_p)
    left, right = _window(window_size)
    scale = _scale(softmax_scale)
    if _is_torch(q):
        q, k, v = (_unit_last_dim(t) for t in (q, k, v))
        out, lse = _torch_forward((q, k, v, None, None, scale, bool(causal), left, right, float(softcap)),
                                  return_lse, deterministic)
    else:
        out, lse = _arrays.forward(q, k, v, None, None, scale, bool(causal), left, right, float(softcap))
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False, window_size=(-1, -1), softcap=0.0, return_lse=False, deterministic=False, *,
                           dropout_p=0.0):
    """Attention over packed sequences of different lengths: q [total_q, heads_q, d], k and v
    [total_k, heads_kv, d], sequence b at rows cu_seqlens[b] .. cu_seqlens[b + 1] (int32).

    max_seqlen_q and max_seqlen_k are accepted for FlashAttention call sites; the library reads the
    lengths from cu_seqlens itself (and checks them), so they do not change the result.
    """
    _no_dropout(dropout_p)
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, numbers.Integral) or m < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {m!r}")
    left, right = _window(window_size)
    scale = _scale(softmax_scale)
    if _is_torch(q):
        q, k, v = (_unit_last_dim(t) for t in (q, k, v))
        out, lse = _torch_forward((q, k, v, cu_seqlens_q, cu_seqlens_k, scale, bool(causal), left, right,
                                   float(softcap)), return_lse, deterministic)
    else:
        out, lse = _arrays.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, bool(causal), left, right,
                                   float(softcap))
    return (out, lse) if return_lse else out


def _unpack(packed, name, count, rank, num_heads_q=None):
    """Views (no copy) of the tensors stacked in `packed`: with num_heads_q None, `count` slices of
    its axis -3 ([..., count, heads, d], FlashAttention-2's packing); else q, k, v as consecutive
    head ranges of its heads axis ([..., heads_q + 2 * heads_kv, d], FlashAttention-3's packing for
    GQA). `rank` is the unpacked tensors' rank (4, or 3 when varlen)."""
    shape = tuple(packed.shape)
    layout = "[batch, seqlen" if rank == 4 else "[total"
    if num_heads_q is None:
        if len(shape) != rank + 1 or shape[-3] != count:
            raise ValueError(f"{name}: expected {layout}, {count}, heads, head_dim], got shape {list(shape)}")
        return tuple(packed[..., i, :, :] for i in range(count))
    if len(shape) != rank:
        raise ValueError(f"{name}: with num_heads_q, expected {layout}, heads_q + 2 * heads_kv, head_dim], "
                         f"got shape {list(shape)}")
    heads_kv2 = shape[-2] - num_heads_q if isinstance(num_heads_q, numbers.Integral) else 0
    if heads_kv2 <= 0 or heads_kv2 % 2 or num_heads_q <= 0:
        raise ValueError(f"num_heads_q: expected 1 <= num_heads_q < {shape[-2]} leaving an even number of KV heads "
                         f"in {name}'s {shape[-2]}, got {num_heads_q!r}")
    hq, hkv = int(num_heads_q), heads_kv2 // 2
    return packed[..., :hq, :], packed[..., hq:hq + hkv, :], packed[..., hq + hkv:, :]


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              return_lse=False, deterministic=False, num_heads_q=None, *, dropout_p=0.0):
    """flash_attn_func on q, k, v packed in one tensor: qkv [batch, seqlen, 3, heads, d], or
    [batch, seqlen, heads_q + 2 * heads_kv, d] with num_heads_q (GQA). The three are read in place;
    with torch, the gradient comes back as one tensor of qkv's shape."""
    q, k, v = _unpack(qkv, "qkv", 3, 4, num_heads_q)
    return flash_attn_func(q, k, v, softmax_scale, causal, window_size, softcap, return_lse, deterministic,
                           dropout_p=dropout_p)


def flash_attn_kvpacked_func(q, kv, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                             return_lse=False, deterministic=False, *, dropout_p=0.0):
    """flash_attn_func with k and v packed: kv [batch, seqlen_k, 2, heads_kv, d]."""
    k, v = _unpack(kv, "kv", 2, 4)
    return flash_attn_func(q, k, v, softmax_scale, causal, window_size, softcap, return_lse, deterministic,
                           dropout_p=dropout_p)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, return_lse=False, deterministic=False,
                                     num_heads_q=None, *, dropout_p=0.0):
    """flash_attn_varlen_func on packed sequences whose q, k, v share one tensor: qkv [total, 3,
    heads, d], or [total, heads_q + 2 * heads_kv, d] with num_heads_q; cu_seqlens serves both."""
    q, k, v = _unpack(qkv, "qkv", 3, 3, num_heads_q)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale, causal,
                                  window_size, softcap, return_lse, deterministic, dropout_p=dropout_p)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0, return_lse=False,
                                    deterministic=False, *, dropout_p=0.0):
    """flash_attn_varlen_func with k and v packed: kv [total_k, 2, heads_kv, d]."""
    k, v = _unpack(kv, "kv", 2, 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                  causal, window_size, softcap, return_lse, deterministic, dropout_p=dropout_p)


def _cache_capacity(k_cache, block_table):
    if block_table is not None:
        return block_table.shape[1] * k_cache.shape[1]
    return k_cache.shape[1]


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, num_splits=0,
                            return_lse=False):
    """Attention of new query tokens q [batch, seqlen_new, heads_q, d] against a KV cache.

    k_cache, v_cache: [batch, capacity, heads_kv, d], or paged [num_pages, page_size, heads_kv, d]
    with block_table int32 [batch, max_pages_per_seq] (page ids of each sequence, in order).
    cache_seqlens: int32 [batch] (or an int for every sequence): tokens already in the cache; None
    means the whole capacity (only without k, v).
    k, v: optional [batch, seqlen_new, heads_kv, d], written into the caches in place at
    cache_seqlens before attention; the query then sees cache_seqlens + seqlen_new keys.
    num_splits: split-KV chunks per sequence (0 = the library chooses).
    """
    if (k is None) != (v is None):
        raise ValueError("k, v: appending to the cache needs both k and v")
    left, right = _window(window_size)
    scale = _scale(softmax_scale)
    appending = k is not None
    batch = q.shape[0]
    if cache_seqlens is None:
        if appending:
            raise ValueError("cache_seqlens: required when appending k, v (where the new tokens go)")
        cache_seqlens = _cache_capacity(k_cache, block_table)
    if _is_torch(q):
        if isinstance(cache_seqlens, numbers.Integral):
            cache_seqlens = torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=q.device)
        q = _unit_last_dim(q)
        opts = (scale, bool(causal), left, right, float(softcap), int(num_splits))
        if appending:
            k, v = _unit_last_dim(k), _unit_last_dim(v)
        if _undispatched(q, k_cache, v_cache, k, v, cache_seqlens, block_table):
            out, lse = _torch_ops.decode_step(q, k_cache, v_cache, k, v, cache_seqlens, block_table, *opts,
                                              with_lse=bool(return_lse))
        elif appending:
            out, lse = _torch_ops.kvcache_append(q, k_cache, v_cache, k, v, cache_seqlens, block_table, *opts)
        else:
            out, lse = _torch_ops.kvcache(q, k_cache, v_cache, cache_seqlens, block_table, *opts)
    else:
        if isinstance(cache_seqlens, numbers.Integral):
            cache_seqlens = _arrays.full_seqlens(batch, int(cache_seqlens))
        out, lse = _arrays.decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, bool(causal), left,
                                  right, float(softcap), int(num_splits))
    return (out, lse) if return_lse else out


def merge_states(o_parts, lse_parts):
    """Merges attention states computed over disjoint key sets into (out, lse).

    o_parts [num_parts, tokens, heads, d], lse_parts [num_parts, tokens, heads] (float32; float64
    with float64 o_parts). A part with lse = -inf is empty and weighs 0; when every part is empty,
    out = 0 and lse = -inf. With torch tensors it is differentiable (an empty part gets zero
    gradients).
    """
    if _is_torch(o_parts):
        return _torch_ops.merge(_unit_last_dim(o_parts), lse_parts)
    return _arrays.merge_states(o_parts, lse_parts)
