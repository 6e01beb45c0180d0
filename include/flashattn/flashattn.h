/* flashattn C ABI: the operations of flashattn.hpp over plain structs, for FFI callers (Python
 * ctypes/cffi, Rust, Julia, ...). Layouts and semantics are those of flashattn.hpp.
 *
 * Each function returns a status code (FLASHATTN_OK = 0). On failure, flashattn_last_error()
 * returns this thread's message, which names the argument and what was expected; no output has
 * been written. Structs are versioned by size: set `struct_size = sizeof(the struct)` so that
 * later, larger versions of the library can tell old callers apart. */
#ifndef FLASHATTN_H_
#define FLASHATTN_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FLASHATTN_API __declspec(dllexport)
#else
#define FLASHATTN_API __attribute__((visibility("default")))
#endif

enum {
  FLASHATTN_OK = 0,
  FLASHATTN_INVALID_ARGUMENT = 1,
  FLASHATTN_UNSUPPORTED = 2,
  FLASHATTN_CUDA_ERROR = 3,
  FLASHATTN_INTERNAL = 4
};

enum { FLASHATTN_F16 = 0, FLASHATTN_BF16 = 1, FLASHATTN_F32 = 2, FLASHATTN_F64 = 3, FLASHATTN_I32 = 4 };
enum { FLASHATTN_CPU = 0, FLASHATTN_CUDA = 1 };

#define FLASHATTN_MAX_RANK 4

/* rank = 0 means "absent" for optional tensors. Strides are in elements. */
typedef struct flashattn_tensor {
  void* data;
  int32_t dtype;
  int32_t device;
  int32_t device_index;
  int32_t rank;
  int64_t shape[FLASHATTN_MAX_RANK];
  int64_t stride[FLASHATTN_MAX_RANK];
} flashattn_tensor;

typedef struct flashattn_options {
  float softmax_scale; /* 0 = 1/sqrt(head_dim) */
  int32_t causal;
  int64_t window_left;  /* -1 = unbounded */
  int64_t window_right; /* -1 = unbounded */
  float softcap;        /* 0 = off */
  int32_t num_threads;  /* CPU: 0 = all cores */
  void* stream;         /* CUDA stream, NULL = default */
} flashattn_options;

typedef struct flashattn_forward_args {
  uint32_t struct_size;
  flashattn_tensor q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k;
  flashattn_options options;
} flashattn_forward_args;

typedef struct flashattn_backward_args {
  uint32_t struct_size;
  flashattn_tensor dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k;
  flashattn_options options;
  int32_t deterministic;
} flashattn_backward_args;

typedef struct flashattn_decode_args {
  uint32_t struct_size;
  flashattn_tensor q, k_cache, v_cache, block_table, cache_seqlens, k_new, v_new, out, lse;
  int32_t num_splits;
  flashattn_options options;
} flashattn_decode_args;

typedef struct flashattn_merge_args {
  uint32_t struct_size;
  flashattn_tensor o_parts, lse_parts, out, lse;
  flashattn_options options;
} flashattn_merge_args;

/* A decode step planned once and run many times (see flashattn.hpp "decode in two phases"). Filled
 * by flashattn_plan_decode; callers read workspace_bytes and num_splits and pass the plan back
 * unchanged. */
typedef struct flashattn_decode_plan {
  uint32_t struct_size;
  int32_t device, device_index, dtype;
  int64_t batch, seqlen_new, heads_q, heads_kv, head_dim;
  int32_t paged, append;
  int64_t num_pages, page_size, max_pages_per_seq;
  int64_t max_cache_seqlen;
  int32_t num_splits;
  int64_t workspace_bytes;
} flashattn_decode_plan;

/* Fault bits of flashattn_decode_status. */
enum { FLASHATTN_DECODE_FAULT_LENGTH = 1, FLASHATTN_DECODE_FAULT_PAGE = 2 };

/* Defaults: options unbounded windows, everything else zero; struct_size set. */
FLASHATTN_API flashattn_options flashattn_default_options(void);
FLASHATTN_API flashattn_tensor flashattn_contiguous(void* data, int32_t dtype, int32_t device, int32_t rank,
                                                    const int64_t* shape);

FLASHATTN_API int flashattn_forward(const flashattn_forward_args* args);
FLASHATTN_API int flashattn_backward(const flashattn_backward_args* args);
FLASHATTN_API int flashattn_decode(const flashattn_decode_args* args);
FLASHATTN_API int flashattn_merge_states(const flashattn_merge_args* args);

/* max_cache_seqlen: 0 = the largest cache_seqlens entry of args. Set plan->struct_size first. */
FLASHATTN_API int flashattn_plan_decode(const flashattn_decode_args* args, int64_t max_cache_seqlen,
                                        flashattn_decode_plan* plan);
/* No allocation, no host synchronization: capturable in a CUDA graph. */
FLASHATTN_API int flashattn_decode_run(const flashattn_decode_args* args, const flashattn_decode_plan* plan,
                                       void* workspace);
/* Waits for `stream` (NULL = default), then reports the faults of the last run on `workspace`;
 * first_sequence may be NULL. */
FLASHATTN_API int flashattn_decode_status(const flashattn_decode_plan* plan, const void* workspace, void* stream,
                                          uint32_t* faults, int64_t* first_sequence);

/* This thread's last error message ("" after a success). Valid until the next call on this thread. */
FLASHATTN_API const char* flashattn_last_error(void);
FLASHATTN_API const char* flashattn_version(void);
/* The GPU forward or backward kernel that ran last on this thread, e.g. "fwd hopper hdim128 bf16
 * sm90a" ("" before the first GPU call). Valid until the next call on this thread. */
FLASHATTN_API const char* flashattn_last_gpu_kernel(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H_ */
