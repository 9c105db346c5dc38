// INT8 GEMM tests: every ISA path this CPU runs must give exactly the naive int32 reference (and so
// exactly the scalar path) for m = 1..17 and n, k off the 16 / 4 block sizes; saturation corners up to
// k = kInt8MaxK; outputs poisoned with guard cells after the end; W8A8 / W8A16 float outputs against a
// double-precision reference of the same quantized values; 1 vs 3 threads bit-identical.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "tests/kernels/cpu/int8_test_util.h"
#include "kernels/common/quantize.h"
#include "base/error.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_int8_gemm {

using namespace lattice;
using namespace lattice::test;

namespace {

constexpr int32_t kPoisonI = 0x7eadbeef;
constexpr int64_t kGuard = 37;

// Runs gemm_s8s8_s32 into a poisoned buffer with guard cells; checks the guard and returns c.
std::vector<int32_t> run_s8(const std::vector<int8_t>& a, int64_t m, int64_t k, const PackedInt8& w, ThreadPool& pool) {
    std::vector<int32_t> c(size_t(m * w.n + kGuard), kPoisonI);
    gemm_s8s8_s32(a.data(), m, k, w, c.data(), pool);
    for (int64_t i = m * w.n; i < m * w.n + kGuard; ++i) REQUIRE(c[size_t(i)] == kPoisonI);
    c.resize(size_t(m * w.n));
    return c;
}

void check_exact(const std::vector<int8_t>& a, const std::vector<int8_t>& q, int64_t m, int64_t n, int64_t k,
                 ThreadPool& pool) {
    std::vector<int64_t> ref = naive_s8(a.data(), q.data(), m, n, k);
    for (IsaLevel isa : supported_isas()) {
        PackedInt8 w = pack_int8_weights(q.data(), n, k, isa);
        std::vector<int32_t> c = run_s8(a, m, k, w, pool);
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < c.size(); ++i)
            if (int64_t(c[i]) != ref[i]) {
                if (first < 0) first = int64_t(i);
                ++bad;
            }
        INFO("isa=", isa_name(isa), " m=", m, " n=", n, " k=", k, " first bad index=", first);
        REQUIRE(bad == 0);
    }
}

}  // namespace

TEST_CASE("isa: detection, parse and override") {
    CHECK(isa_supported(IsaLevel::kScalar));
    CHECK(isa_supported(best_isa()));
    CHECK(parse_isa("scalar") == IsaLevel::kScalar);
    CHECK(parse_isa("avx2") == IsaLevel::kAvx2);
    CHECK(parse_isa("avxvnni") == IsaLevel::kAvxVnni);
    CHECK(parse_isa("avx512") == IsaLevel::kAvx512Vnni);
    CHECK_THROWS_AS(parse_isa("avx1024"), Error);
    for (IsaLevel l : supported_isas()) CHECK(parse_isa(isa_name(l)) == l);
    set_isa_override(IsaLevel::kScalar);
    CHECK(detect_isa() == IsaLevel::kScalar);
    clear_isa_override();
    CHECK(detect_isa() == best_isa());
    MESSAGE("best ISA on this CPU: ", isa_name(best_isa()), "; paths tested: ", supported_isas().size());
}

TEST_CASE("s8s8: every ISA path equals the reference for m = 1..17 and odd n, k") {
    ThreadPool pool(3);
    std::mt19937 rng(1234);
    for (int64_t n : {1, 15, 17, 33, 100})
        for (int64_t k : {1, 3, 4, 37, 64, 129, 300}) {
            std::vector<int8_t> q = random_i8(size_t(n * k), rng);
            std::vector<int8_t> a = random_i8(size_t(17 * k), rng);
            q[0] = -128;  // the -128 weight and the largest activation appear in every case
            a[0] = 127;
            REQUIRE(any_nonzero(q));
            REQUIRE(any_nonzero(a));
            for (int64_t m = 1; m <= 17; ++m) check_exact(a, q, m, n, k, pool);
        }
}

TEST_CASE("s8s8: larger blocked-GEMM shape with tails in m, n and k") {
    ThreadPool pool(3);
    std::mt19937 rng(99);
    const int64_t m = 61, n = 259, k = 1001;
    std::vector<int8_t> q = random_i8(size_t(n * k), rng);
    std::vector<int8_t> a = random_i8(size_t(m * k), rng);
    REQUIRE(any_nonzero(q));
    REQUIRE(any_nonzero(a));
    check_exact(a, q, m, n, k, pool);
}

TEST_CASE("s8s8: saturation corners (-128 / 127 everywhere) are exact up to kInt8MaxK") {
    ThreadPool pool(2);
    for (int64_t k : {int64_t(1), int64_t(4), int64_t(299), int64_t(4099), kInt8MaxK}) {
        const int64_t n = 17, m = 9;  // 9 rows: the blocked-GEMM tile (8 rows) and its tail, not only the GEMV
        // Rows of a cycle through all -128, all 127, alternating. Weight rows cycle through
        // all -128, all 127, alternating, and the opposite alternation.
        std::vector<int8_t> a(size_t(m * k)), q(size_t(n * k));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t t = 0; t < k; ++t) {
                int8_t v = (t % 2) ? int8_t(127) : int8_t(-128);
                if (i % 3 == 0) v = -128;
                if (i % 3 == 1) v = 127;
                a[size_t(i * k + t)] = v;
            }
        for (int64_t j = 0; j < n; ++j)
            for (int64_t t = 0; t < k; ++t) {
                int8_t v;
                switch (j % 4) {
                    case 0: v = -128; break;
                    case 1: v = 127; break;
                    case 2: v = (t % 2) ? int8_t(127) : int8_t(-128); break;
                    default: v = (t % 2) ? int8_t(-128) : int8_t(127); break;
                }
                q[size_t(j * k + t)] = v;
            }
        std::vector<int64_t> ref = naive_s8(a.data(), q.data(), m, n, k);
        CHECK(ref[0] == 16384 * k);  // (-128) * (-128) * k: the largest magnitude
        for (IsaLevel isa : supported_isas()) {
            PackedInt8 w = pack_int8_weights(q.data(), n, k, isa);
            std::vector<int32_t> c = run_s8(a, m, k, w, pool);
            for (size_t i = 0; i < c.size(); ++i) {
                INFO("isa=", isa_name(isa), " k=", k, " i=", i);
                REQUIRE(int64_t(c[i]) == ref[i]);
            }
        }
    }
}

TEST_CASE("w8a8: float output matches a double reference and is bit-identical across ISA paths") {
    ThreadPool pool(3);
    std::mt19937 rng(7);
    for (int64_t n : {1, 17, 100})
        for (int64_t k : {3, 64, 129, 300})
            for (int64_t m : {1, 2, 5, 9, 17}) {
                std::vector<float> wf = random_f32(size_t(n * k), rng, 0.05f);
                std::vector<float> x = random_f32(size_t(m * k), rng, 2.0f);
                x[0] = 40.0f;  // an outlier channel, as in real activations
                std::vector<int8_t> q(size_t(n * k));
                std::vector<float> sw(static_cast<size_t>(n));
                quantize_weights_per_channel(wf.data(), n, k, q.data(), sw.data());
                REQUIRE(any_nonzero(q));
                // Reference from the shared quantize math, accumulated in double.
                std::vector<int8_t> xq(size_t(m * k));
                std::vector<float> sx(static_cast<size_t>(m));
                for (int64_t r = 0; r < m; ++r) sx[size_t(r)] = quantize_row_int8(x.data() + r * k, k, xq.data() + r * k);
                REQUIRE(any_nonzero(xq));
                std::vector<int64_t> ci = naive_s8(xq.data(), q.data(), m, n, k);
                std::vector<float> first;
                for (IsaLevel isa : supported_isas()) {
                    PackedInt8 w = pack_int8_weights(q.data(), n, k, isa);
                    std::vector<float> y(size_t(m * n + kGuard), std::nanf(""));
                    gemm_w8a8(x.data(), m, k, w, sw.data(), y.data(), pool);
                    for (int64_t i = m * n; i < m * n + kGuard; ++i) REQUIRE(std::isnan(y[size_t(i)]));
                    for (int64_t r = 0; r < m; ++r)
                        for (int64_t j = 0; j < n; ++j) {
                            double ref = double(ci[size_t(r * n + j)]) * double(sx[size_t(r)]) * double(sw[size_t(j)]);
                            double got = y[size_t(r * n + j)];
                            INFO("isa=", isa_name(isa), " m=", m, " n=", n, " k=", k, " r=", r, " j=", j);
                            REQUIRE(std::fabs(got - ref) <= 4e-7 * std::fabs(ref) + 1e-30);
                        }
                    y.resize(size_t(m * n));
                    if (first.empty()) first = y;
                    INFO("isa=", isa_name(isa));
                    REQUIRE(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) == 0);
                }
            }
}

TEST_CASE("w8a16: float output matches a double reference of the same int8 weights") {
    ThreadPool pool(3);
    std::mt19937 rng(11);
    for (int64_t n : {1, 15, 33, 100})
        for (int64_t k : {1, 3, 37, 129, 300})
            for (int64_t m : {1, 2, 3, 7, 13, 17, 33}) {  // 33: the AVX-512 prefill (f32 panel) path
                std::vector<float> wf = random_f32(size_t(n * k), rng, 0.05f);
                std::vector<float> x = random_f32(size_t(m * k), rng, 1.0f);
                std::vector<int8_t> q(size_t(n * k));
                std::vector<float> sw(static_cast<size_t>(n));
                quantize_weights_per_channel(wf.data(), n, k, q.data(), sw.data());
                REQUIRE(any_nonzero(q));
                for (IsaLevel isa : supported_isas()) {
                    PackedInt8 w = pack_int8_weights(q.data(), n, k, isa);
                    std::vector<float> y(size_t(m * n + kGuard), std::nanf(""));
                    gemm_w8a16(x.data(), m, k, w, sw.data(), y.data(), pool);
                    for (int64_t i = m * n; i < m * n + kGuard; ++i) REQUIRE(std::isnan(y[size_t(i)]));
                    for (int64_t r = 0; r < m; ++r)
                        for (int64_t j = 0; j < n; ++j) {
                            double ref = 0, mag = 0;
                            for (int64_t t = 0; t < k; ++t) {
                                double p = double(x[size_t(r * k + t)]) * double(q[size_t(j * k + t)]);
                                ref += p;
                                mag += std::fabs(p);
                            }
                            ref *= sw[size_t(j)];
                            mag *= sw[size_t(j)];
                            // f32 summation bound: (k + 1) ulps of the magnitude sum.
                            double tol = double(k + 1) * 6.0e-8 * mag + 1e-30;
                            INFO("isa=", isa_name(isa), " m=", m, " n=", n, " k=", k, " r=", r, " j=", j);
                            REQUIRE(std::fabs(double(y[size_t(r * n + j)]) - ref) <= tol);
                        }
                }
            }
}

TEST_CASE("threads: 1 and 3 threads give bit-identical results on every path") {
    ThreadPool pool1(1), pool3(3);
    std::mt19937 rng(5);
    const int64_t n = 161, k = 259;  // 11 panels: uneven split, 4-panel blocks plus tails
    std::vector<float> wf = random_f32(size_t(n * k), rng, 0.1f);
    std::vector<int8_t> q(size_t(n * k));
    std::vector<float> sw(static_cast<size_t>(n));
    quantize_weights_per_channel(wf.data(), n, k, q.data(), sw.data());
    for (int64_t m : {1, 4, 17, 40}) {
        std::vector<float> x = random_f32(size_t(m * k), rng, 1.0f);
        std::vector<int8_t> a = random_i8(size_t(m * k), rng);
        for (IsaLevel isa : supported_isas()) {
            INFO("isa=", isa_name(isa), " m=", m);
            PackedInt8 w = pack_int8_weights(q.data(), n, k, isa);
            std::vector<float> y1(size_t(m * n), -1.0f), y3(size_t(m * n), -2.0f);
            gemm_w8a8(x.data(), m, k, w, sw.data(), y1.data(), pool1);
            gemm_w8a8(x.data(), m, k, w, sw.data(), y3.data(), pool3);
            CHECK(std::memcmp(y1.data(), y3.data(), y1.size() * 4) == 0);
            std::fill(y1.begin(), y1.end(), -1.0f);
            std::fill(y3.begin(), y3.end(), -2.0f);
            gemm_w8a16(x.data(), m, k, w, sw.data(), y1.data(), pool1);
            gemm_w8a16(x.data(), m, k, w, sw.data(), y3.data(), pool3);
            CHECK(std::memcmp(y1.data(), y3.data(), y1.size() * 4) == 0);
            CHECK(run_s8(a, m, k, w, pool1) == run_s8(a, m, k, w, pool3));
        }
    }
}

TEST_CASE("errors: bad shapes and mismatches throw; m = 0 writes nothing") {
    ThreadPool pool(1);
    std::vector<int8_t> q(17 * 5, 3);
    PackedInt8 w = pack_int8_weights(q.data(), 17, 5, best_isa());
    CHECK(w.k_padded == 8);
    CHECK(w.n_panels == 2);
    CHECK(w.col_sums[0] == 15);
    CHECK(w.col_sums[17] == 0);
    std::vector<float> x(10, 1.0f), sw(17, 1.0f), y(34, 0.0f);
    CHECK_THROWS_AS(gemm_w8a8(x.data(), 2, 4, w, sw.data(), y.data(), pool), Error);  // k mismatch
    CHECK_THROWS_AS(gemm_w8a16(x.data(), 1, 6, w, sw.data(), y.data(), pool), Error);
    CHECK_THROWS_AS(pack_int8_weights(q.data(), 0, 5, best_isa()), Error);
    CHECK_THROWS_AS(pack_int8_weights(q.data(), 1, kInt8MaxK + 1, best_isa()), Error);
    PackedInt8 empty;
    CHECK_THROWS_AS(gemm_w8a8(x.data(), 1, 5, empty, sw.data(), y.data(), pool), Error);
    std::vector<float> y0(4, -7.0f);
    gemm_w8a8(x.data(), 0, 5, w, sw.data(), y0.data(), pool);
    CHECK(y0[0] == -7.0f);
}

}  // namespace test_int8_gemm
