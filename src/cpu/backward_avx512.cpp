// The backward tile arithmetic compiled for AVX-512 (the build gives *_avx512.cpp files those
// flags); backward.cpp calls it only when the engine's active level is AVX-512 and the head dim is
// a multiple of 16 (the tiles' widths must be whole vectors). Register blocks of 6 x 4 zmm
// (29 of the 32 registers with a B row and a broadcast).
#include "cpu/backward_tile_impl.h"

namespace flashattn::cpu::bwd {
TileOps<float> avx512_ops_f32() { return make_ops<float, 16, 4, 6>(); }
TileOps<double> avx512_ops_f64() { return make_ops<double, 8, 4, 6>(); }
}  // namespace flashattn::cpu::bwd
