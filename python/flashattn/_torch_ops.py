"""The library as PyTorch operators: torch.ops.flashattn.{fwd, bwd, kvcache, kvcache_append, merge}.

Each is a torch.library custom op with a fake (meta) implementation, so torch.compile traces
through it without graph breaks; fwd has an autograd formula that calls bwd, and merge one in
torch ops (so that attention over key chunks, merged as cascade and ring attention do, is
differentiable). The real implementations pass raw pointers, shapes and strides to the extension
(no torch below this file), CPU tensors to the CPU engine, CUDA tensors to the GPU kernels on the
current stream.
"""
import atexit
from typing import Optional

import torch
from torch import Tensor

from . import _C

_CODES = {torch.float16: _C.F16, torch.bfloat16: _C.BF16, torch.float32: _C.F32, torch.float64: _C.F64,
          torch.int32: _C.I32}


def _view(t: Tensor, name: str):
    code = _CODES.get(t.dtype)
    if code is None:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (float16, bfloat16, float32, float64; "
                         "torch.int32 for cu_seqlens, cache_seqlens and block_table)")
    # is_cpu / is_cuda and get_device() rather than t.device, which builds an object per call (a
    # decode step makes nine views).
    if t.is_cpu:
        device, index = _C.CPU, 0
    elif t.is_cuda:
        device, index = _C.CUDA, t.get_device()
    else:
        raise ValueError(f"{name}: device {t.device} is not supported (cpu or cuda)")
    return _C.View.raw(t.data_ptr(), code, device, index, t.shape, t.stride())


def _opt(t: Optional[Tensor], name: str):
    return None if t is None else _view(t, name)


def _launch(t: Tensor):
    """num_threads and stream for work on t's device: torch's CPU thread count, or its current stream."""
    if t.is_cuda:
        return {"num_threads": 0, "stream": torch.cuda.current_stream(t.device).cuda_stream}
    return {"num_threads": torch.get_num_threads(), "stream": 0}


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _lse_shape(q: Tensor, varlen: bool):
    want = 3 if varlen else 4
    if q.dim() != want:
        layout = "[total_q, heads_q, head_dim] (varlen)" if varlen else "[batch, seqlen_q, heads_q, head_dim]"
        raise ValueError(f"q: expected rank {want} {layout}, got shape {tuple(q.shape)}")
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _decode_lse_shape(q: Tensor):
    if q.dim() != 4:
        raise ValueError(f"q: expected rank 4 [batch, seqlen_new, heads_q, head_dim], got shape {tuple(q.shape)}")
    return (q.shape[0], q.shape[2], q.shape[1])


def _merge_shapes(o_parts: Tensor):
    if o_parts.dim() != 4:
        raise ValueError(f"o_parts: expected rank 4 [num_parts, tokens, heads, head_dim], got shape "
                         f"{tuple(o_parts.shape)}")
    return o_parts.shape[1:], o_parts.shape[1:3]


# ---- forward and backward -----------------------------------------------------------------------
# `deterministic` is a forward input only so that the autograd formula can hand it to bwd.

def forward_step(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap,
                 with_lse=True):
    """What flashattn::fwd runs; flash_attn_func calls it directly where no dispatch is needed, and
    then without lse (None) when the caller does not want it: its allocation took a tenth of a call
    over 16 tokens."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    lse_shape = _lse_shape(q, varlen)  # also checks q's rank, with the layout in the message
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # cheaper than torch.empty(q.shape, ...)
    lse = torch.empty(lse_shape, dtype=_lse_dtype(q.dtype), device=q.device) if with_lse else None
    _C.forward(_view(q, "q"), _view(k, "k"), _view(v, "v"), _view(out, "out"), _opt(lse, "lse"),
               _opt(cu_seqlens_q, "cu_seqlens_q"), _opt(cu_seqlens_k, "cu_seqlens_k"), softmax_scale=softmax_scale,
               causal=causal, window_left=window_left, window_right=window_right, softcap=softcap, **_launch(q))
    return out, lse


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
        deterministic: bool) -> tuple[Tensor, Tensor]:
    return forward_step(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right,
                        softcap)


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap,
      deterministic):
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, varlen), dtype=_lse_dtype(q.dtype))


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int, window_right: int,
        softcap: float, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _C.backward(_view(dout, "dout"), _view(q, "q"), _view(k, "k"), _view(v, "v"), _view(out, "out"),
                _view(lse, "lse"), _view(dq, "dq"), _view(dk, "dk"), _view(dv, "dv"),
                _opt(cu_seqlens_q, "cu_seqlens_q"), _opt(cu_seqlens_k, "cu_seqlens_k"),
                softmax_scale=softmax_scale, causal=causal, window_left=window_left, window_right=window_right,
                softcap=softcap, deterministic=deterministic, **_launch(q))
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right,
      softcap, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = options  # softmax_scale, causal, window_left, window_right, softcap, deterministic
    # An output nobody differentiates arrives as None rather than zeros: the lse term below then
    # costs nothing when only `out` is used.
    ctx.set_materialize_grads(False)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    opts = ctx.options
    if dout is None:
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    else:
        if dout.stride(-1) != 1:  # e.g. the expanded gradient of a sum; the library needs unit stride
            dout = dout.contiguous()
        dq, dk, dv = bwd(dout, q, k, v, out, lse, cu_q, cu_k, *opts)
    if dlse is not None:
        # d lse_i / d s_ij = P_ij, so an lse gradient g adds dS_ij = g_i P_ij. The backward computes
        # dS = P o (dO V^T - rowsum(dO o O)); with V = 0, O = e_0 and dO = -g e_0 that is exactly
        # g_i P_ij, and the library applies the softcap and scale chain to it as to any dS.
        varlen = cu_q is not None
        g = dlse.transpose(0, 1) if varlen else dlse.transpose(1, 2)  # to the token layout of q
        unit_out = torch.zeros_like(q)
        unit_out[..., 0] = 1
        g_dout = torch.zeros_like(q)
        g_dout[..., 0] = -g.to(q.dtype)
        dq_g, dk_g, _ = bwd(g_dout, q, k, torch.zeros_like(v), unit_out, lse, cu_q, cu_k, *opts)
        dq, dk = dq + dq_g, dk + dk_g
    return dq, dk, dv, None, None, None, None, None, None, None, None


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ---- KV cache -----------------------------------------------------------------------------------
# Two operators, so that only the appending one declares that it writes the caches (a declared
# mutation makes torch.compile treat the caches as written, which is only true when appending).
#
# Every step runs from a plan (the library's plan_decode: host validation, which reads the lengths
# and block table, and on the GPU the split count), made for the longest lengths the cache can
# hold, as FlashAttention sizes its splits by the cache capacity. The latest plan of each problem
# shape is kept: a step captured in a CUDA graph cannot read device memory on the host, so it runs
# the plan that its warm-up (the eager call that torch.cuda.graph asks for) made, and the graph
# stays valid as the lengths grow. Inside a capture the indices are therefore not checked on the
# host; the kernels guard them (an invalid length or page id gives NaN rows, never a stray access).
# CPU steps take the same path (the library checks their indices again on the host, cheaply), so
# the CPU tests cover it.

_plans = {}
# torch's operator registry keeps this module alive past the extension's teardown at exit; the plans
# (extension objects) are dropped before that, so that nanobind finds nothing left over.
atexit.register(_plans.clear)


def _plan_key(q, k_cache, k, block_table, causal, window_left, window_right, num_splits):
    # What the plan's shape check and split choice depend on (the masks bound the keys a split sees).
    return (q.get_device(), q.dtype, tuple(q.shape), tuple(k_cache.shape),
            None if block_table is None else tuple(block_table.shape), k is not None, causal, window_left,
            window_right, num_splits)


def decode_step(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window_left,
                window_right, softcap, num_splits, with_lse=True):
    """What both KV-cache operators run (k, v None: no append); flash_attn_with_kvcache calls it
    directly where no dispatch is needed, and then without lse (None) unless it is asked for."""
    lse_shape = _decode_lse_shape(q)  # also checks q's rank, with the layout in the message
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # cheaper than torch.empty(q.shape, ...)
    lse = torch.empty(lse_shape, dtype=_lse_dtype(q.dtype), device=q.device) if with_lse else None
    args = (_view(q, "q"), _view(k_cache, "k_cache"), _view(v_cache, "v_cache"), _opt(block_table, "block_table"),
            _view(cache_seqlens, "cache_seqlens"), _opt(k, "k"), _opt(v, "v"), _view(out, "out"), _opt(lse, "lse"))
    opts = dict(num_splits=num_splits, softmax_scale=softmax_scale, causal=causal, window_left=window_left,
                window_right=window_right, softcap=softcap, **_launch(q))
    key = _plan_key(q, k_cache, k, block_table, causal, window_left, window_right, num_splits)
    # A CPU step validates its indices on the host when it runs, whatever the plan, so a plan made
    # for the same shapes serves again there.
    plan = _plans.get(key) if q.is_cpu else None
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        plan = _plans.get(key)
        if plan is None:
            raise RuntimeError("flash_attn_with_kvcache: capturing a step of shape q "
                               f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)} needs an eager call with the same "
                               "shapes first (the warm-up that torch.cuda.graph asks for), which plans it on the host")
    elif plan is None:
        room = (k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
                - (q.shape[1] if k is not None else 0))
        # A cache too small for the new tokens (room < 0) is reported by the length checks.
        plan = _C.plan_decode(*args, **opts, max_cache_seqlen=max(room, 0))
        _plans[key] = plan
    # The CPU path needs no workspace (the plan asks for none there).
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=q.device) if plan.workspace_bytes else None
    _C.decode(*args, **opts, plan=plan, workspace=workspace.data_ptr() if workspace is not None else 0)
    return out, lse


def _decode_fake(q):
    return q.new_empty(q.shape), q.new_empty(_decode_lse_shape(q), dtype=_lse_dtype(q.dtype))


@torch.library.custom_op("flashattn::kvcache", mutates_args=())
def kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, block_table: Optional[Tensor],
            softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
            num_splits: int) -> tuple[Tensor, Tensor]:
    return decode_step(q, k_cache, v_cache, None, None, cache_seqlens, block_table, softmax_scale, causal,
                       window_left, window_right, softcap, num_splits)


@kvcache.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, window_left, window_right, softcap,
      num_splits):
    return _decode_fake(q)


@torch.library.custom_op("flashattn::kvcache_append", mutates_args=("k_cache", "v_cache"))
def kvcache_append(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, cache_seqlens: Tensor,
                   block_table: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int,
                   window_right: int, softcap: float, num_splits: int) -> tuple[Tensor, Tensor]:
    return decode_step(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal,
                       window_left, window_right, softcap, num_splits)


@kvcache_append.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window_left, window_right,
      softcap, num_splits):
    return _decode_fake(q)


# ---- merge of partial states --------------------------------------------------------------------

@torch.library.custom_op("flashattn::merge", mutates_args=())
def merge(o_parts: Tensor, lse_parts: Tensor) -> tuple[Tensor, Tensor]:
    out_shape, lse_shape = _merge_shapes(o_parts)
    out = torch.empty(out_shape, dtype=o_parts.dtype, device=o_parts.device)
    lse = torch.empty(lse_shape, dtype=_lse_dtype(o_parts.dtype), device=o_parts.device)
    _C.merge_states(_view(o_parts, "o_parts"), _view(lse_parts, "lse_parts"), _view(out, "out"), _view(lse, "lse"),
                    **_launch(o_parts))
    return out, lse


@merge.register_fake
def _(o_parts, lse_parts):
    out_shape, lse_shape = _merge_shapes(o_parts)
    return o_parts.new_empty(out_shape), o_parts.new_empty(lse_shape, dtype=_lse_dtype(o_parts.dtype))


def _merge_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)
    ctx.set_materialize_grads(False)


def _merge_backward(ctx, dout, dlse):
    # out = sum_i w_i o_i and lse = log sum_i exp(lse_i), with w_i = exp(lse_i - lse), so
    #   d o_i = w_i dout,   d lse_i = w_i (dlse + <dout, o_i - out>)
    # (over the head dim; in the lse's precision). A part with lse_i = -inf is an empty key set: it
    # weighs 0 and gets zero gradients whatever its o holds (NaN, say), as does every part of a row
    # with no key at all (lse = -inf).
    o_parts, lse_parts, out, lse = ctx.saved_tensors
    acc = lse.dtype
    live = (lse_parts > float("-inf")) & (lse > float("-inf"))[None]
    w = torch.where(live, torch.exp(lse_parts.to(acc) - lse[None].to(acc)), 0.0)
    g = torch.zeros_like(w) if dlse is None else dlse[None].to(acc).expand_as(w)
    if dout is None:
        d_o = torch.zeros_like(o_parts)
    else:
        o = torch.where(live[..., None], o_parts.to(acc), 0.0)
        g = g + ((o - out[None].to(acc)) * dout[None].to(acc)).sum(-1)
        d_o = (w[..., None] * dout[None].to(acc)).to(o_parts.dtype)
    return d_o, (w * g).to(lse_parts.dtype)


merge.register_autograd(_merge_backward, setup_context=_merge_setup_context)
