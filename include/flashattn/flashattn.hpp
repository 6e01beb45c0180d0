// flashattn: exact, IO-aware attention (FlashAttention) for C++.
//
// Every operation takes one arguments struct of TensorViews (raw pointer, dtype, device, shape,
// int64 strides in elements) and writes into tensors the caller owns. Nothing here knows a
// framework. Inputs are validated before any work starts; a bad argument throws flashattn::Error
// whose message names the argument and what was expected, and no output is written.
//
// Layouts follow FlashAttention (token-major):
//   q, out          [batch, seqlen_q, heads_q,  head_dim]   or varlen [total_q, heads_q,  head_dim]
//   k, v            [batch, seqlen_k, heads_kv, head_dim]   or varlen [total_k, heads_kv, head_dim]
//   lse             [batch, heads_q, seqlen_q]              or varlen [heads_q, total_q]
// lse tensors are f32, or f64 when the inputs are f64 (CPU only, for gradient checks).
// The last dimension of q, k, v, out (and their gradients) must be contiguous; every other stride is
// free (positive).
//
// Semantics (see README "Semantics"):
//   * scores s = softmax_scale * q.k, then softcap * tanh(s / softcap) when softcap > 0, then masks.
//   * causal and sliding windows are aligned bottom-right: query row i of a sequence with seqlen_q
//     rows sees key j of seqlen_k keys iff  i + seqlen_k - seqlen_q - window_left <= j  (left bound,
//     if window_left >= 0) and  j <= i + seqlen_k - seqlen_q + window_right  (right bound, if
//     window_right >= 0). causal means window_right = 0.
//   * a row that sees no key gets out = 0 and lse = -inf (never NaN) and zero gradients.
//   * lse is the natural-log logsumexp of the row's (scaled, capped) scores.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace flashattn {

enum class DType : int32_t { f16 = 0, bf16 = 1, f32 = 2, f64 = 3, i32 = 4 };
enum class DeviceType : int32_t { cpu = 0, cuda = 1 };

const char* dtype_name(DType t);
int64_t dtype_size(DType t);

inline constexpr int kMaxRank = 4;

// A non-owning view of a strided tensor. rank == 0 means "absent" (for optional arguments).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  DeviceType device = DeviceType::cpu;
  int32_t device_index = 0;
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in elements

  bool defined() const { return rank != 0; }  // a negative rank is present (and rejected)
  int64_t numel() const;
  // A row-major (contiguous) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               DeviceType device = DeviceType::cpu, int32_t device_index = 0);
};

enum class Status : int32_t {
  ok = 0,
  invalid_argument = 1,  // a bad input; the message names the argument
  unsupported = 2,       // valid, but not available in this build or on this device
  cuda_error = 3,        // the CUDA runtime reported an error
  internal = 4,
};

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

// Options shared by every attention operation.
struct AttnOptions {
  float softmax_scale = 0.f;  // > 0; 0 means 1/sqrt(head_dim)
  bool causal = false;        // bottom-right aligned; implies window_right = 0
  int64_t window_left = -1;   // -1 = unbounded
  int64_t window_right = -1;  // -1 = unbounded (must be -1 or 0 when causal)
  float softcap = 0.f;        // 0 = off; otherwise scores become softcap * tanh(s / softcap)
  int32_t num_threads = 0;    // CPU engine: 0 = all cores
  void* stream = nullptr;     // CUDA: a cudaStream_t; nullptr = the default stream
};

struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;
  TensorView lse;           // optional output
  TensorView cu_seqlens_q;  // optional i32 [batch + 1]: varlen when given (with cu_seqlens_k); rows
                            // outside [cu[0], cu[batch]) are neither read nor written
  TensorView cu_seqlens_k;
  AttnOptions options;
};

struct BackwardArgs {
  TensorView dout, q, k, v, out, lse;  // lse is required here (the forward's)
  TensorView dq, dk, dv;
  TensorView cu_seqlens_q, cu_seqlens_k;
  AttnOptions options;
  bool deterministic = false;  // GPU: fixed accumulation order for dq (the CPU engine always is)
};

// Attention of a few new query tokens per sequence against a KV cache.
//   q              [batch, seqlen_new, heads_q, head_dim]
//   k_cache/v_cache paged  [num_pages, page_size, heads_kv, head_dim] with block_table, or
//                  contiguous [batch, capacity, heads_kv, head_dim] without it
//   block_table    optional i32 [batch, max_pages_per_seq]: page ids of each sequence, in order
//   cache_seqlens  i32 [batch]: tokens already in the cache before this call
//   k_new/v_new    optional [batch, seqlen_new, heads_kv, head_dim]: appended to the cache at
//                  cache_seqlens (written in place) before attention
//   out [batch, seqlen_new, heads_q, head_dim], lse optional f32 [batch, heads_q, seqlen_new]
// The keys a sequence attends to are its cache_seqlens[b] (+ seqlen_new when appending) tokens;
// causal and windows are bottom-right aligned over them. Sequences may share pages they read (a
// common prefix); a slot a sequence appends to must hold no other token, of any sequence (decode
// and plan_decode reject such a block table; a planned run does not check it, and the results of
// the sequences involved are then unspecified, with no access outside the tensors).
struct DecodeArgs {
  TensorView q;
  TensorView k_cache, v_cache;
  TensorView block_table;
  TensorView cache_seqlens;
  TensorView k_new, v_new;
  TensorView out, lse;
  int32_t num_splits = 0;  // 0 = choose; 1..kMaxSplits = split each KV range into that many chunks
  AttnOptions options;
};
inline constexpr int32_t kMaxSplits = 256;

// Merge partial attention states computed over disjoint key sets.
//   o_parts [num_parts, tokens, heads, head_dim], lse_parts f32 [num_parts, tokens, heads]
//   out     [tokens, heads, head_dim],            lse optional f32 [tokens, heads]
// A part with lse = -inf is an empty set and weighs 0; if every part is empty, out = 0 and
// lse = -inf.
struct MergeArgs {
  TensorView o_parts, lse_parts;
  TensorView out, lse;
  AttnOptions options;  // only num_threads and stream are used
};

void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);
// Validates everything on the host (this reads cache_seqlens and block_table, a synchronous copy
// when they live on the GPU), then plans and runs the step with a temporary workspace.
void decode(const DecodeArgs& args);
void merge_states(const MergeArgs& args);

// ---- decode in two phases: plan on the host once, run many times (CUDA-graph friendly) ---------
//
//   DecodePlan plan = plan_decode(args, max_cache_seqlen);   // host: validates, reads the lengths
//   cudaMalloc(&ws, plan.workspace_bytes);
//   decode(args, plan, ws);                                   // no allocation, no host sync
//   ... capture decode(args, plan, ws) in a CUDA graph, then, as cache_seqlens grows on the
//   device (up to max_cache_seqlen), replay it ...
//   DecodeStatus st = decode_status(plan, ws);                // when the caller wants to know
//
// plan_decode validates args exactly as decode(args) does, including every cache length and the
// block-table entries those lengths use, chooses the split count (args.num_splits, or 0 = enough
// KV splits to fill the GPU for sequences of max_cache_seqlen tokens) and sizes the workspace.
//
// decode(args, plan, workspace) re-checks on the host only what it can without reading device
// memory (shapes, dtypes, strides, devices, and that they match the plan). The tensors may be
// other buffers of the same shapes than at planning time. cache_seqlens and block_table are read
// by the kernels only, and are NOT validated on the host; the kernels guard every index instead:
//   * a length that is negative, above plan.max_cache_seqlen, or that with the appended tokens
//     exceeds the cache capacity: nothing of that sequence is read or appended, its out and lse
//     rows are NaN, fault kDecodeFaultLength;
//   * a block-table entry outside [0, num_pages) among the pages the step reads or appends to:
//     that page is neither read nor written, the rows computed from it are NaN (every row of the
//     sequence unless a sliding window keeps some rows off that page), fault kDecodeFaultPage.
// Nothing outside the tensors is ever read or written. decode_status reports the faults of the
// last run that used the workspace. On CPU tensors the run validates the indices on the host
// (they are host memory) and throws as decode(args) does; the workspace is unused there.
inline constexpr uint32_t kDecodeFaultLength = 1;
inline constexpr uint32_t kDecodeFaultPage = 2;

struct DecodePlan {
  DeviceType device = DeviceType::cpu;
  int32_t device_index = 0;
  DType dtype = DType::f32;
  // The problem shape the plan was made for; a run must have the same.
  int64_t batch = 0, seqlen_new = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  bool paged = false, append = false;
  int64_t num_pages = 0, page_size = 0, max_pages_per_seq = 0;  // contiguous: page_size = capacity
  int64_t max_cache_seqlen = 0;  // the largest cache_seqlens entry a run may hold
  int32_t num_splits = 0;        // GPU: KV chunks per sequence; CPU: args.num_splits (0 = per run)
  int64_t workspace_bytes = 0;   // device memory decode(args, plan, ws) needs, 256-byte aligned
};

struct DecodeStatus {
  uint32_t faults = 0;          // kDecodeFault* bits, 0 = every index was valid
  int64_t first_sequence = -1;  // the lowest batch index that had a fault, -1 if none
  bool ok() const { return faults == 0; }
};

// max_cache_seqlen: 0 = the largest cache_seqlens entry of args; otherwise at least that, and with
// the appended tokens within the cache capacity.
DecodePlan plan_decode(const DecodeArgs& args, int64_t max_cache_seqlen = 0);
// workspace: plan.workspace_bytes of device memory on the plan's device, 256-byte aligned (any
// cudaMalloc result), used by one run at a time; nullptr is allowed on the CPU.
void decode(const DecodeArgs& args, const DecodePlan& plan, void* workspace);
// Waits for the work queued on `stream` (a cudaStream_t; nullptr = the default stream), then reads
// the faults the last run on `workspace` recorded.
DecodeStatus decode_status(const DecodePlan& plan, const void* workspace, void* stream = nullptr);

// What this build and machine offer.
struct BuildInfo {
  std::string version;
  bool cuda_compiled = false;
  std::string cuda_kernels;  // human-readable list of GPU kernels compiled in
  std::string cpu_features;  // e.g. "avx2 fma f16c"
  std::string cpu_kernel;    // the SIMD level the CPU engine dispatches to
  int cpu_threads = 0;
  int cuda_devices = 0;
  std::string cuda_device_names;
};
BuildInfo build_info();

// The GPU forward or backward kernel that ran last on the calling thread, e.g. "fwd hopper hdim128
// bf16 sm90a" or "fwd portable hdim96 f16 sm80" (empty before the first GPU call): which path a
// problem took.
std::string last_gpu_kernel();

}  // namespace flashattn
