// The backward tile arithmetic for any CPU (baseline ISA, e.g. SSE2 on x86-64): narrow register
// blocks of 128-bit vectors.
#include "cpu/backward_tile_impl.h"

namespace flashattn::cpu::bwd {
TileOps<float> portable_ops_f32() { return make_ops<float, 4, 2>(); }
TileOps<double> portable_ops_f64() { return make_ops<double, 2, 2>(); }
}  // namespace flashattn::cpu::bwd
