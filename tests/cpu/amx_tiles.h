// The calling thread's AMX tile configuration, for the tests that check the library leaves it as
// it found it (src/cpu/amx.h: code around us may count on its configuration staying loaded). The
// functions carry the amx-tile target themselves, so the test programs need no AMX flags; call
// them only where flashattn::cpu::detected_level() is KernelLevel::amx.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace fa_test {

struct alignas(64) TileConfig {
  uint8_t bytes[64] = {};
};

// A configuration the library does not use: palette 1, tile 0 of 2 rows x 8 bytes.
inline TileConfig foreign_tile_config() {
  TileConfig c;
  c.bytes[0] = 1;
  c.bytes[16] = 8;
  c.bytes[48] = 2;
  return c;
}

__attribute__((target("amx-tile"), noinline)) inline void load_tile_config(const TileConfig& c) {
  _tile_loadconfig(c.bytes);
}

// The thread's configuration now (all zero where none is loaded).
__attribute__((target("amx-tile"), noinline)) inline TileConfig current_tile_config() {
  TileConfig c;
  _tile_storeconfig(c.bytes);
  return c;
}

__attribute__((target("amx-tile"), noinline)) inline void release_tiles() { _tile_release(); }

}  // namespace fa_test
#endif
