// FLOP and memory-traffic counts used by the benchmarks and `flashattn demo`.
#pragma once

#include <cstdint>

namespace flashattn::core {

// Forward matmul FLOPs: QK^T and PV, 2*s_q*s_k*d each, halved when causal (the convention of
// FlashAttention's and the anchors' benchmarks).
inline double forward_flops(int64_t b, int64_t h, int64_t s_q, int64_t s_k, int64_t d, bool causal) {
  double f = 4.0 * double(b) * double(h) * double(s_q) * double(s_k) * double(d);
  return causal ? f * 0.5 : f;
}

// Backward: recompute S, then dV, dP, dQ, dK: 2.5x the forward.
inline double backward_flops(int64_t b, int64_t h, int64_t s_q, int64_t s_k, int64_t d, bool causal) {
  return 2.5 * forward_flops(b, h, s_q, s_k, d, causal);
}

// The seed's HBM traffic analysis for one head, in elements:
//   standard attention writes and reads S and P (4 N^2) and moves Q, K, V, O (4 N d);
//   FlashAttention with query tiles of block_m rows reads Q and writes O once (2 N d) and re-reads
//   K and V once per query tile (2 N^2 d / block_m).
inline double standard_traffic_elems(int64_t n, int64_t d) {
  return 4.0 * double(n) * double(n) + 4.0 * double(n) * double(d);
}
inline double flash_traffic_elems(int64_t n, int64_t d, int64_t block_m) {
  return 2.0 * double(n) * double(d) + 2.0 * double(n) * double(n) * double(d) / double(block_m);
}

}  // namespace flashattn::core
