// PLACEHOLDER so the suite links while the real tests are written.
#include <gtest/gtest.h>
#include "flashattn/flashattn.hpp"
TEST(Smoke, DtypeNames) { EXPECT_STREQ(flashattn::dtype_name(flashattn::DType::bf16), "bf16"); }
