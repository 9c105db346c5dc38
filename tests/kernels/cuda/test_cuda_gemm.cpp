// CUDA GEMMs against CPU references:
//   cuBLASLt IMMA int8 GEMM: exact int32 (padded n, k; m = 1, odd m, a larger tile-filling case);
//   cuBLASLt fp16/bf16 GEMM; W8A8 dp4a GEMV: exact (int32 dot, same dequant order); W8A16 GEMV
//   (scalar and vector x paths); the int32 dequant epilogue: exact.
#include <algorithm>
#include <numeric>

#include "tests/kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/kernels.h"

using namespace lattice;
using namespace lattice::test;

namespace {

std::vector<int8_t> random_i8(std::mt19937_64& rng, int64_t rows, int64_t cols, int64_t ld) {
    std::vector<int8_t> v(size_t(rows * ld), 0);  // zero padding in [cols, ld)
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) v[size_t(i * ld + j)] = int8_t(int(rng() % 255) - 127);
    return v;
}

int32_t dot_i8(const int8_t* a, const int8_t* b, int64_t k) {
    int32_t s = 0;
    for (int64_t j = 0; j < k; ++j) s += int32_t(a[j]) * int32_t(b[j]);
    return s;
}

}  // namespace

TEST_CASE("cuda int8 GEMM (cuBLASLt IMMA) is exact in int32" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    cuda::LtGemm lt;
    for (auto [m, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{1, 45, 77}, {5, 45, 77}, {33, 100, 200}, {64, 256, 512}}) {
        INFO("m=" << m << " n=" << n << " k=" << k);
        const int64_t np = (n + 15) / 16 * 16, kp = (k + 15) / 16 * 16;
        std::vector<int8_t> x = random_i8(rng, m, k, kp), w = random_i8(rng, np, k, kp);
        std::fill(w.begin() + n * kp, w.end(), int8_t(0));  // padded channels
        DevBuf dx(x), dw(w), dc(size_t(m * np) * 4);
        lt.gemm_i8(dc.get<int32_t>(), np, dx.get<int8_t>(), kp, dw.get<int8_t>(), kp, m, np, kp, nullptr);
        std::vector<int32_t> c = dc.download<int32_t>(size_t(m * np));
        bool nonzero = false;
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < np; ++j) {
                const int32_t ref = dot_i8(&x[size_t(i * kp)], &w[size_t(j * kp)], kp);
                nonzero |= ref != 0;
                REQUIRE(c[size_t(i * np + j)] == ref);
            }
        CHECK(nonzero);
    }
}

TEST_CASE("cuda float GEMM (cuBLASLt, fp32 accumulate)" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    cuda::LtGemm lt;
    for (DType act : {DType::kF16, DType::kBF16}) {
        for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 45, 77}, {17, 64, 130}}) {
            std::vector<float> x = random_vec(rng, size_t(m * k)), w = random_vec(rng, size_t(n * k));
            for (auto* v : {&x, &w})
                for (auto& e : *v) e = round_act(e, act);
            DevBuf dx(to_act(x, act)), dw(to_act(w, act)), dy(size_t(m * n) * 2);
            lt.gemm_float(dy.get(), n, dx.get(), k, dw.get(), k, m, n, k, act, act, nullptr);
            std::vector<float> ref(static_cast<size_t>(m * n));
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    double s = 0;
                    for (int64_t t = 0; t < k; ++t) s += double(x[size_t(i * k + t)]) * w[size_t(j * k + t)];
                    ref[size_t(i * n + j)] = float(s);
                }
            CHECK(rel_err(from_act(dy.download<uint16_t>(size_t(m * n)), act), ref) < tol_for(act));
        }
    }
}

TEST_CASE("cuda W8A8 GEMV (dp4a) and the dequant epilogue are exact" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : {DType::kF16, DType::kBF16}) {
        for (int64_t m : {1, 3, 8}) {
            const int64_t n = 37, k = 90, kp = 96;
            std::vector<int8_t> x = random_i8(rng, m, k, kp), w = random_i8(rng, n, k, kp);
            std::vector<float> sx = random_vec(rng, size_t(m), 0.01f, 0.05f),
                               sw = random_vec(rng, size_t(n), 0.001f, 0.01f);
            DevBuf dx(x), dw(w), dsx(sx), dsw(sw), dy(size_t(m * n) * 2);
            cuda::gemv_w8a8(dy.get(), dx.get<int8_t>(), kp, dsx.get<float>(), dw.get<int8_t>(), kp, dsw.get<float>(), m,
                            n, kp, act, act, nullptr);
            std::vector<float> got = from_act(dy.download<uint16_t>(size_t(m * n)), act);
            std::vector<int32_t> acc(static_cast<size_t>(m * n));
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    acc[size_t(i * n + j)] = dot_i8(&x[size_t(i * kp)], &w[size_t(j * kp)], kp);
                    REQUIRE(got[size_t(i * n + j)] ==
                            round_act(float(acc[size_t(i * n + j)]) * (sx[size_t(i)] * sw[size_t(j)]), act));
                }
            // Epilogue of the IMMA path on the same accumulators (ld > n): identical numbers.
            DevBuf dacc(acc), dy2(size_t(m * n) * 2);
            cuda::dequant_i32(dy2.get(), dacc.get<int32_t>(), n, dsx.get<float>(), dsw.get<float>(), m, n, act, act,
                              nullptr);
            CHECK(from_act(dy2.download<uint16_t>(size_t(m * n)), act) == got);
            // f32 outputs (LM-head logits): the unrounded products, identical on both paths.
            DevBuf df1(size_t(m * n) * 4), df2(size_t(m * n) * 4);
            cuda::gemv_w8a8(df1.get(), dx.get<int8_t>(), kp, dsx.get<float>(), dw.get<int8_t>(), kp, dsw.get<float>(),
                            m, n, kp, act, DType::kF32, nullptr);
            cuda::dequant_i32(df2.get(), dacc.get<int32_t>(), n, dsx.get<float>(), dsw.get<float>(), m, n, act,
                              DType::kF32, nullptr);
            std::vector<float> f1 = df1.download<float>(size_t(m * n));
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j)
                    REQUIRE(f1[size_t(i * n + j)] == float(acc[size_t(i * n + j)]) * (sx[size_t(i)] * sw[size_t(j)]));
            CHECK(df2.download<float>(size_t(m * n)) == f1);
        }
    }
}

TEST_CASE("cuda W8A16 GEMV: scalar and vector activation paths" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : {DType::kF16, DType::kBF16}) {
        for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 100}, {8, 100}, {1, 4096}, {5, 4096}}) {
            INFO(dtype_name(act) << " m=" << m << " k=" << k);
            const int64_t n = 37, kp = (k + 15) / 16 * 16;
            std::vector<int8_t> w = random_i8(rng, n, k, kp);
            std::vector<float> sw = random_vec(rng, size_t(n), 0.001f, 0.01f), x = random_vec(rng, size_t(m * k));
            for (auto& e : x) e = round_act(e, act);
            DevBuf dx(to_act(x, act)), dw(w), dsw(sw), dy(size_t(m * n) * 2);
            cuda::gemv_w8a16(dy.get(), dx.get(), dw.get<int8_t>(), kp, dsw.get<float>(), m, n, k, act, act, nullptr);
            DevBuf dyf(size_t(m * n) * 4);
            cuda::gemv_w8a16(dyf.get(), dx.get(), dw.get<int8_t>(), kp, dsw.get<float>(), m, n, k, act, DType::kF32,
                             nullptr);
            std::vector<float> ref(static_cast<size_t>(m * n));
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    double s = 0;
                    for (int64_t t = 0; t < k; ++t) s += double(x[size_t(i * k + t)]) * w[size_t(j * kp + t)];
                    ref[size_t(i * n + j)] = float(s * sw[size_t(j)]);
                }
            CHECK(rel_err(from_act(dy.download<uint16_t>(size_t(m * n)), act), ref) < tol_for(act));
            CHECK(rel_err(dyf.download<float>(size_t(m * n)), ref) < 1e-5);  // fp32 out: only summation order
        }
    }
}
