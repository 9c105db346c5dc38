// Quantization math (kernels/common/quantize.h, quantize_rows.h, quantize_weights_per_channel): scale definition,
// round-trip error <= s/2, zero rows, rounding half away from zero, clamping, NaN, non-finite weights.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/common/quantize.h"
#include "kernels/common/quantize_rows.h"
#include "kernels/cpu/int8_gemm_kernels.h"
#include "tests/kernels/cpu/int8_test_util.h"

using namespace lattice;
using namespace lattice::test;

TEST_CASE("quantize_weights_per_channel: s = max|w|/127, |w - q s| <= s/2, zero row -> s = 1") {
    std::mt19937 rng(3);
    const int64_t n = 9, k = 333;
    std::vector<float> w = random_f32(size_t(n * k), rng, 0.02f);
    for (int64_t t = 0; t < k; ++t) w[size_t(2 * k + t)] = 0.0f;  // all-zero row
    w[size_t(5 * k + 7)] = -3.5f;                                 // outlier sets the row's scale
    std::vector<int8_t> q(size_t(n * k), 99);
    std::vector<float> s(size_t(n), -1.0f);
    quantize_weights_per_channel(w.data(), n, k, q.data(), s.data());
    for (int64_t i = 0; i < n; ++i) {
        float amax = 0;
        for (int64_t t = 0; t < k; ++t) amax = std::max(amax, std::fabs(w[size_t(i * k + t)]));
        INFO("row ", i);
        if (amax == 0) {
            CHECK(s[size_t(i)] == 1.0f);
            for (int64_t t = 0; t < k; ++t) CHECK(q[size_t(i * k + t)] == 0);
            continue;
        }
        CHECK(s[size_t(i)] == amax / 127.0f);
        int qmax = 0;
        for (int64_t t = 0; t < k; ++t) {
            int v = q[size_t(i * k + t)];
            REQUIRE(v >= -127);
            REQUIRE(v <= 127);
            qmax = std::max(qmax, std::abs(v));
            double err = std::fabs(double(w[size_t(i * k + t)]) - double(v) * double(s[size_t(i)]));
            REQUIRE(err <= 0.5 * double(s[size_t(i)]) * (1.0 + 1e-5));
        }
        CHECK(qmax == 127);
    }
    CHECK(q[size_t(5 * k + 7)] == -127);
}

TEST_CASE("quantize_row_int8: rounding half away from zero, clamp, NaN -> 0") {
    CHECK(quantize_int8_value(2.5f, 1.0f) == 3);
    CHECK(quantize_int8_value(-2.5f, 1.0f) == -3);
    CHECK(quantize_int8_value(0.49f, 1.0f) == 0);
    CHECK(quantize_int8_value(1000.0f, 1.0f) == 127);
    CHECK(quantize_int8_value(-1000.0f, 1.0f) == -127);
    CHECK(quantize_int8_value(std::nanf(""), 1.0f) == 0);
    float x[5] = {0.0f, 1.0f, -2.0f, 0.5f, 127.0f};
    int8_t q[5];
    float s = quantize_row_int8(x, 5, q);
    CHECK(s == 1.0f);
    CHECK(q[1] == 1);
    CHECK(q[2] == -2);
    CHECK(q[3] == 1);
    CHECK(q[4] == 127);
    float z[3] = {0, -0.0f, 0};
    CHECK(quantize_row_int8(z, 3, q) == 1.0f);
    CHECK(q[0] == 0);
}

TEST_CASE("quantize_weights_per_channel rejects non-finite weights") {
    std::vector<float> w = {1.0f, INFINITY, 0.5f, 0.25f};
    std::vector<int8_t> q(4);
    std::vector<float> s(2);
    CHECK_THROWS_AS(quantize_weights_per_channel(w.data(), 2, 2, q.data(), s.data()), Error);
}

TEST_CASE("quantize_weights_per_channel from f16 / bf16 rows: the bits of the f32 matrix's, errors at their row") {
    std::mt19937 rng(5);
    const int64_t n = 7, k = 130;
    const std::vector<float> w = random_f32(size_t(n * k), rng, 0.5f);
    for (DType dt : {DType::kF16, DType::kBF16}) {
        INFO(dtype_name(dt));
        auto [h, widened] = round_to_16bit(w, dt);  // the 16-bit rows, and what they hold as f32
        std::vector<int8_t> q(w.size()), q_ref(w.size());
        std::vector<float> s(static_cast<size_t>(n)), s_ref(static_cast<size_t>(n));
        quantize_weights_per_channel(h.data(), dt, n, k, q.data(), s.data());
        quantize_weights_per_channel(widened.data(), n, k, q_ref.data(), s_ref.data());
        CHECK(q == q_ref);
        CHECK(s == s_ref);
        ThreadPool pool(2);  // the rows split among threads: the same bits
        std::vector<int8_t> q_pool(w.size());
        std::vector<float> s_pool(static_cast<size_t>(n));
        quantize_weights_per_channel(h.data(), dt, n, k, q_pool.data(), s_pool.data(), &pool);
        CHECK(q_pool == q_ref);
        CHECK(s_pool == s_ref);
        h[size_t(4 * k + 9)] = dt == DType::kF16 ? uint16_t(0x7E00) : uint16_t(0x7FC0);  // NaN in row 4
        h[size_t(6 * k + 1)] = dt == DType::kF16 ? uint16_t(0x7C00) : uint16_t(0x7F80);  // Inf in row 6
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            try {
                quantize_weights_per_channel(h.data(), dt, n, k, q.data(), s.data(), p);
                FAIL("a NaN weight was accepted");
            } catch (const Error& e) {  // the first bad row is named, whichever thread met it
                CHECK(std::string(e.what()).find("at [4, 9]") != std::string::npos);
            }
        }
    }
    std::vector<int8_t> q(4);
    std::vector<float> s(2);
    const std::vector<int8_t> i8(4);
    CHECK_THROWS_AS(quantize_weights_per_channel(i8.data(), DType::kI8, 2, 2, q.data(), s.data()), Error);
}

TEST_CASE("quantize_rows_int8: a range's first non-finite row returned and skipped, the others quantized") {
    std::mt19937 rng(6);
    const int64_t n = 6, k = 40;
    std::vector<float> w = random_f32(size_t(n * k), rng, 1.0f);
    w[size_t(2 * k + 5)] = NAN;
    w[size_t(4 * k + 39)] = -INFINITY;  // the last column: the exponent test covers the tail
    std::vector<int8_t> q(w.size(), 99);
    std::vector<float> s(size_t(n), -1.0f);
    CHECK(quantize_rows_int8(w.data(), DType::kF32, k, 0, 2, q.data(), s.data()) == 2);  // none in [0, 2)
    CHECK(quantize_rows_int8(w.data(), DType::kF32, k, 2, n, q.data(), s.data()) == 2);
    CHECK(quantize_rows_int8(w.data(), DType::kF32, k, 3, n, q.data(), s.data()) == 4);
    CHECK(s[2] == -1.0f);  // left as it was
    CHECK(s[4] == -1.0f);
    CHECK(q[size_t(2 * k)] == 99);
    for (int64_t i : {0, 1, 3, 5}) {
        std::vector<int8_t> ref(static_cast<size_t>(k));
        CHECK(s[size_t(i)] == quantize_row_int8(w.data() + i * k, k, ref.data()));
        CHECK(std::equal(ref.begin(), ref.end(), q.begin() + i * k));
    }
    CHECK_THROWS_WITH_AS(fail_non_finite_row(w.data(), DType::kF32, k, 4, "layer.7"),
                         doctest::Contains("layer.7: non-finite weight -inf at [4, 39]"), Error);
    CHECK_THROWS_WITH_AS(fail_non_finite_row(w.data(), DType::kF32, k, 1, "x"), doctest::Contains("only finite"),
                         Error);
}

TEST_CASE("quantize_row_int8_avx2 is bit-identical to the scalar quantize (ties, NaN, tails, zero rows)") {
    if (!isa_supported(IsaLevel::kAvx2)) {
        MESSAGE("AVX2 not supported on this CPU: SIMD quantize not tested");
        return;
    }
    std::mt19937 rng(17);
    for (int64_t k : {1, 7, 8, 9, 16, 31, 100, 4099}) {
        for (int variant = 0; variant < 5; ++variant) {
            std::vector<float> x = random_f32(static_cast<size_t>(k), rng, 3.0f);
            if (variant == 1) {  // exact ties: amax 127 -> s = 1, values j + 0.5
                for (int64_t i = 0; i < k; ++i) x[size_t(i)] = float(int(i % 253) - 126) + ((i % 2) ? 0.5f : -0.5f);
                x[0] = 127.0f;
            }
            if (variant == 2) x[size_t(k / 2)] = std::nanf("");
            if (variant == 3) std::fill(x.begin(), x.end(), 0.0f);
            if (variant == 4) x[size_t(k - 1)] = -1e30f;  // one huge value: everything else rounds to 0
            std::vector<int8_t> q1(size_t(k), 55), q2(size_t(k), 66);
            float s1 = quantize_row_int8(x.data(), k, q1.data());
            float s2 = int8_detail::quantize_row_int8_avx2(x.data(), k, q2.data());
            INFO("k=", k, " variant=", variant);
            CHECK(s1 == s2);
            CHECK(q1 == q2);
            if (variant == 1 && k >= 4) {  // -124.5 -> -125 and -122.5 -> -123: half away from zero, not even
                CHECK(q1[1] == -125);
                CHECK(q1[2] == -125);
                CHECK(q1[3] == -123);
            }
        }
    }
}
