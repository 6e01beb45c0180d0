// The backward tile arithmetic compiled for AVX2 + FMA (the build gives *_avx2.cpp files those
// flags); backward.cpp calls it only when the engine's active level is AVX2 or above. Register
// blocks of 6 x 2 ymm (15 of the 16 registers with a B row and a broadcast; 1.13x the 4 x 2 blocks).
#include "cpu/backward_tile_impl.h"

namespace flashattn::cpu::bwd {
TileOps<float> avx2_ops_f32() { return make_ops<float, 8, 2, 6>(); }
TileOps<double> avx2_ops_f64() { return make_ops<double, 4, 2, 6>(); }
}  // namespace flashattn::cpu::bwd
