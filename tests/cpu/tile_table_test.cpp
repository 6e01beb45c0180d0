// The tile table's host arithmetic (src/cuda/tile_size.h), checked where CI runs: which GPUs the
// sm80 build's large entries (the sm90 shapes) go to. The opt-in limits per block are the CUDA
// programming guide's: 163 KB on the A100 and sm87, 227 KB on Hopper, 99 KB on sm86 and sm89.
#include <gtest/gtest.h>

#include "cuda/tile_size.h"

namespace fa_test {
namespace {

using flashattn::cuda::takes_large_entry;

constexpr int kKB = 1024;

TEST(TileTable, LargeEntriesGoOnlyToGpusOf160KbBlocks) {
  // Where a large entry fits a 160+ KB block, the GPU takes it.
  EXPECT_TRUE(takes_large_entry(163 * kKB, 144 * kKB));
  EXPECT_TRUE(takes_large_entry(227 * kKB, 208 * kKB));
  // Not where it does not fit (the 99 KB entry runs instead).
  EXPECT_FALSE(takes_large_entry(163 * kKB, 208 * kKB));
  // sm86/89 keep the entries made for their 99 KB, also where a large one would fit.
  EXPECT_FALSE(takes_large_entry(99 * kKB, 64 * kKB));
  EXPECT_FALSE(takes_large_entry(99 * kKB, 99 * kKB));
}

}  // namespace
}  // namespace fa_test
