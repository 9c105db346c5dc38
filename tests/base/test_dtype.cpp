// dtype conversions: exact widening, round-to-nearest-even narrowing, specials.
#include "base/dtype.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

using namespace lattice;

TEST_CASE("f16 round trip is exact for every finite half") {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        uint16_t x = uint16_t(h);
        if ((x & 0x7c00) == 0x7c00 && (x & 0x3ff)) continue;  // NaN payloads
        CHECK(f32_to_f16(f16_to_f32(x)) == x);
    }
}

TEST_CASE("f16 known values and rounding") {
    CHECK(f16_to_f32(0x3c00) == 1.0f);
    CHECK(f16_to_f32(0xc000) == -2.0f);
    CHECK(f16_to_f32(0x7bff) == 65504.0f);
    CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(f32_to_f16(65520.0f) == 0x7c00);  // rounds to inf
    CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even (down)
    CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie to even (up)
    CHECK(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("bf16 round to nearest even and nearest error bound") {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-1e4f, 1e4f);
    for (int i = 0; i < 100000; ++i) {
        float f = d(rng);
        float r = bf16_to_f32(f32_to_bf16(f));
        CHECK(std::fabs(r - f) <= std::fabs(f) * (1.0f / 256.0f));
    }
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("block dtype sizes") {
    CHECK(dtype_bytes(DType::kQ8_0, 64) == 68);
    CHECK(dtype_bytes(DType::kQ4_0, 32) == 18);
    CHECK(dtype_bytes(DType::kQ4_1, 32) == 20);
    CHECK(dtype_bytes(DType::kBF16, 3) == 6);
}
