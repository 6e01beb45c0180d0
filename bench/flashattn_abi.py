"""The C ABI of include/flashattn/flashattn.h as ctypes structures, for the benchmark scripts
that call libflashattn beside PyTorch in one process. One mirror of the header: when a struct in
flashattn.h changes, this file changes with it (the library rejects a struct_size smaller than its
own, so a stale mirror fails loudly rather than passing garbage).
"""
import ctypes as C

F16, BF16, F32, F64, I32 = 0, 1, 2, 3, 4  # FLASHATTN_F16 ... FLASHATTN_I32
CPU, CUDA = 0, 1


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int32), ("device", C.c_int32), ("device_index", C.c_int32),
                ("rank", C.c_int32), ("shape", C.c_int64 * 4), ("stride", C.c_int64 * 4)]


class Options(C.Structure):
    _fields_ = [("softmax_scale", C.c_float), ("causal", C.c_int32), ("window_left", C.c_int64),
                ("window_right", C.c_int64), ("softcap", C.c_float), ("num_threads", C.c_int32),
                ("stream", C.c_void_p)]


class ForwardArgs(C.Structure):
    _fields_ = [("struct_size", C.c_uint32)] + [(n, Tensor) for n in
                ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")] + [("options", Options)]


class BackwardArgs(C.Structure):
    _fields_ = [("struct_size", C.c_uint32)] + [(n, Tensor) for n in
                ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv", "cu_seqlens_q", "cu_seqlens_k")] + [
                    ("options", Options), ("deterministic", C.c_int32)]


class DecodeArgs(C.Structure):
    _fields_ = [("struct_size", C.c_uint32)] + [(n, Tensor) for n in (
        "q", "k_cache", "v_cache", "block_table", "cache_seqlens", "k_new", "v_new", "out", "lse")] + [
        ("num_splits", C.c_int32), ("options", Options)]


class DecodePlan(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("device", C.c_int32), ("device_index", C.c_int32),
                ("dtype", C.c_int32)] + [(n, C.c_int64) for n in (
                    "batch", "seqlen_new", "heads_q", "heads_kv", "head_dim")] + [
        ("paged", C.c_int32), ("append", C.c_int32)] + [(n, C.c_int64) for n in (
            "num_pages", "page_size", "max_pages_per_seq", "max_cache_seqlen")] + [
        ("num_splits", C.c_int32), ("workspace_bytes", C.c_int64)]


def view(t, dtype_code):
    """A flashattn_tensor over a CUDA torch tensor (no copy; strides as the tensor has them)."""
    v = Tensor()
    v.data = t.data_ptr()
    v.dtype = dtype_code
    v.device = CUDA
    v.device_index = t.device.index or 0
    v.rank = t.dim()
    for i in range(t.dim()):
        v.shape[i] = t.shape[i]
        v.stride[i] = t.stride(i)
    return v


def load(path):
    """libflashattn with the argument types of every entry point the scripts call."""
    lib = C.CDLL(path)
    lib.flashattn_forward.argtypes = [C.POINTER(ForwardArgs)]
    lib.flashattn_backward.argtypes = [C.POINTER(BackwardArgs)]
    lib.flashattn_plan_decode.argtypes = [C.POINTER(DecodeArgs), C.c_int64, C.POINTER(DecodePlan)]
    lib.flashattn_decode_run.argtypes = [C.POINTER(DecodeArgs), C.POINTER(DecodePlan), C.c_void_p]
    lib.flashattn_decode_status.argtypes = [C.POINTER(DecodePlan), C.c_void_p, C.c_void_p, C.POINTER(C.c_uint32),
                                            C.POINTER(C.c_int64)]
    lib.flashattn_last_error.restype = C.c_char_p
    lib.flashattn_last_gpu_kernel.restype = C.c_char_p
    return lib
