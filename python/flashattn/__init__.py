"""flashattn: exact, IO-aware attention (FlashAttention) on NVIDIA GPUs and CPUs.

Switching from FlashAttention is one import:

    from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

torch tensors get autograd, torch.compile support and the current CUDA stream (the operators are
torch.ops.flashattn.*); NumPy arrays and other DLPack producers run on the CPU engine. See
flashattn.flash_attn_interface for layouts, semantics and errors.
"""
from ._C import build_info, last_gpu_kernel
from .flash_attn_interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                                   flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                                   flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache, merge_states)

__version__ = build_info()["version"]

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
           "merge_states", "build_info", "last_gpu_kernel", "__version__"]
