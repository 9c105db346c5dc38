// Float GEMM: every ISA path this CPU runs against a double-precision reference, for m = 1..17
// and n, k that are not multiples of the tiles (NR = 4/2 rows, 16/8 lanes), every weight dtype,
// 1 and 3 threads; outputs poisoned with NaN so an unwritten element fails.
#include "kernels/cpu/gemm_f32.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace lattice;

namespace {
struct Weights {
    std::vector<float> f32;      // exact values used by the reference
    std::vector<uint16_t> bits;  // f16/bf16 storage
};

Weights make_weights(DType dt, int64_t n, int64_t k, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Weights w;
    w.f32.resize(size_t(n * k));
    w.bits.resize(size_t(n * k));
    for (size_t i = 0; i < w.f32.size(); ++i) {
        float v = u(rng);
        if (dt == DType::kF16) {
            w.bits[i] = f32_to_f16(v);
            v = f16_to_f32(w.bits[i]);
        } else if (dt == DType::kBF16) {
            w.bits[i] = f32_to_bf16(v);
            v = bf16_to_f32(w.bits[i]);
        }
        w.f32[i] = v;
    }
    return w;
}
}  // namespace

TEST_CASE("gemm_f32: every ISA path matches a float64 reference on awkward shapes") {
    std::mt19937 rng(123);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    // The float GEMM's own forms: scalar, avx2, avx512 (the other levels run one of them).
    std::vector<IsaLevel> isas;
    for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512Vnni})
        if (isa_supported(l)) isas.push_back(l);
    for (int threads : {1, 3}) {
        ThreadPool pool(threads, false);
        for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
            for (int64_t n : {1, 3, 5, 17, 33}) {
                for (int64_t k : {1, 7, 16, 31, 100, 259}) {
                    Weights w = make_weights(dt, n, k, rng);
                    for (int64_t m : {1, 2, 3, 4, 5, 8, 17}) {
                        std::vector<float> x(size_t(m * k));
                        for (auto& v : x) v = u(rng);
                        std::vector<double> ref(size_t(m * n), 0.0);
                        for (int64_t i = 0; i < m; ++i)
                            for (int64_t j = 0; j < n; ++j) {
                                double acc = 0;
                                for (int64_t p = 0; p < k; ++p) acc += double(x[size_t(i * k + p)]) * w.f32[size_t(j * k + p)];
                                ref[size_t(i * n + j)] = acc;
                            }
                        const void* wp = dt == DType::kF32 ? static_cast<const void*>(w.f32.data()) : w.bits.data();
                        for (IsaLevel isa : isas) {
                            CAPTURE(isa_name(isa));
                            CAPTURE(dtype_name(dt));
                            CAPTURE(m);
                            CAPTURE(n);
                            CAPTURE(k);
                            CAPTURE(threads);
                            std::vector<float> y(size_t(m * n), std::nanf(""));
                            gemm_f32(x.data(), m, k, wp, dt, n, y.data(), pool, isa);
                            double worst = 0;
                            for (size_t i = 0; i < y.size(); ++i) {
                                REQUIRE(std::isfinite(y[i]));
                                // fp32 accumulation of k products of magnitude <= 1
                                worst = std::max(worst, std::fabs(y[i] - ref[i]) / (1e-6 * double(k) + 1e-7));
                            }
                            CHECK(worst <= 1.0);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("gemm_f32: large prefill shape takes the converted-panel path and agrees with the scalar path") {
    std::mt19937 rng(5);
    ThreadPool pool(2, false);
    const int64_t m = 37, n = 70, k = 300;
    Weights w = make_weights(DType::kBF16, n, k, rng);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(size_t(m * k));
    for (auto& v : x) v = u(rng);
    std::vector<float> a(size_t(m * n), std::nanf("")), b(size_t(m * n), std::nanf(""));
    gemm_f32(x.data(), m, k, w.bits.data(), DType::kBF16, n, a.data(), pool, IsaLevel::kScalar);
    gemm_f32(x.data(), m, k, w.bits.data(), DType::kBF16, n, b.data(), pool);
    for (size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(a[i] - b[i]) <= 1e-4f * (1.0f + std::fabs(a[i])));
}

TEST_CASE("gemm_f32 rejects unsupported weight dtypes") {
    ThreadPool pool(1, false);
    float x = 1, y = 0;
    int8_t w = 1;
    CHECK_THROWS_WITH(gemm_f32(&x, 1, 1, &w, DType::kI8, 1, &y, pool), doctest::Contains("i8"));
}

TEST_CASE("gemm_f32: a row's outputs do not depend on the batch (small-k path, rows split when n is small)") {
    // k <= 16 (a LoRA adapter's B^T) runs vectors along n; n < 16 x threads with many rows (its A^T) splits the
    // rows over the threads. Either way a row's outputs must equal, bit for bit, those of the row alone on one
    // thread: a mixed batch then gives each sequence the tokens it gets alone.
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    ThreadPool one(1, false), three(3, false);
    for (IsaLevel isa : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512Vnni}) {
        if (!isa_supported(isa)) continue;
        for (DType dt : {DType::kF32, DType::kBF16}) {
            for (const auto& shape : {std::pair<int64_t, int64_t>{40, 16}, {33, 4}, {16, 300}, {8, 2048}}) {
                const int64_t n = shape.first, k = shape.second;
                CAPTURE(isa_name(isa));
                CAPTURE(dtype_name(dt));
                CAPTURE(n);
                CAPTURE(k);
                const int64_t m = 64;
                Weights w = make_weights(dt, n, k, rng);
                const void* wp = dt == DType::kF32 ? static_cast<const void*>(w.f32.data()) : w.bits.data();
                std::vector<float> x(size_t(m * k));
                for (auto& v : x) v = u(rng);
                std::vector<float> all(size_t(m * n), std::nanf(""));
                gemm_f32(x.data(), m, k, wp, dt, n, all.data(), three, isa);
                int differ = 0;
                for (int64_t i = 0; i < m; i += 7) {
                    std::vector<float> alone(size_t(n), std::nanf(""));
                    gemm_f32(x.data() + i * k, 1, k, wp, dt, n, alone.data(), one, isa);
                    for (int64_t j = 0; j < n; ++j) differ += alone[size_t(j)] != all[size_t(i * n + j)];
                }
                CHECK(differ == 0);
            }
        }
    }
}
