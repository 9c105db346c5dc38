// CUDA GEMMs against CPU references:
//   cuBLASLt IMMA int8 GEMM: exact int32 (padded n, k; odd m, a larger tile-filling case) at the row
//   counts the backend sends it (m > kGemvMaxRows; m = 1 and 5 only where cuBLASLt accepts them);
//   the same with autotuning on and off (identical int32), the plan cache (a repeated shape builds
//   no plan and times nothing; a new alignment class gets its own plan), and a shape first seen
//   during graph capture (first working candidate, no timing, correct on replay);
//   cuBLASLt fp16/bf16 GEMM; W8A8 dp4a GEMV for every m in 1..16: exact (int32 dot, same dequant
//   order), odd n, padded k, k long enough for every k-slice count; W8A16 GEMV for every m:
//   the 8-byte vector path (k % 4 == 0, with a partial last 16-chunk) and the any-k / unaligned
//   path; the int32 dequant epilogue: exact.
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/kernels.h"
#include "tests/kernels/cuda/cuda_test_util.h"

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

int64_t pad16(int64_t v) {
    return (v + 15) / 16 * 16;
}

// Random operands of one IMMA GEMM, zero padded to multiples of 16 as the backend pads them, and
// the exact int32 reference c[m, np].
struct I8Gemm {
    int64_t m, np, kp;
    std::vector<int8_t> x, w;
    std::vector<int32_t> ref;
    I8Gemm(std::mt19937_64& rng, int64_t m_, int64_t n, int64_t k) : m(m_), np(pad16(n)), kp(pad16(k)) {
        x = random_i8(rng, m, k, kp);
        w = random_i8(rng, np, k, kp);
        std::fill(w.begin() + n * kp, w.end(), int8_t(0));  // padded channels
        ref.resize(size_t(m * np));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < np; ++j)
                ref[size_t(i * np + j)] = dot_i8(&x[size_t(i * kp)], &w[size_t(j * kp)], kp);
    }
    void run(cuda::LtGemm& lt, int32_t* c, const DevBuf& dx, const DevBuf& dw, cudaStream_t stream) const {
        lt.gemm_i8(c, np, dx.get<int8_t>(), kp, dw.get<int8_t>(), kp, m, np, kp, stream);
    }
};

cuda::LtOptions no_autotune() {
    cuda::LtOptions o;
    o.autotune = false;
    return o;
}

}  // namespace

TEST_CASE("cuda int8 GEMM (cuBLASLt IMMA) is exact in int32" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    cuda::LtGemm lt;
    // The backend asks IMMA only for m > kGemvMaxRows (decode batches of up to 16 rows take the GEMV), and
    // there through try_gemm_i8, falling back to the GEMV in row chunks where cuBLASLt has no algorithm
    // (CudaBackend::matmul_w8a8). So: m = 17, 33 and 64 go through gemm_i8 (must have an algorithm: the
    // shapes the product runs); m = 1 and 5 (tile edges the product never sends) through try_gemm_i8,
    // which may refuse them: then nothing was enqueued and there is nothing to check, as in the backend.
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 45, 77},
                           {5, 45, 77},
                           {17, 45, 77},
                           {33, 100, 200},
                           {64, 256, 512}}) {
        INFO("m=" << m << " n=" << n << " k=" << k);
        const int64_t np = (n + 15) / 16 * 16, kp = (k + 15) / 16 * 16;
        std::vector<int8_t> x = random_i8(rng, m, k, kp), w = random_i8(rng, np, k, kp);
        std::fill(w.begin() + n * kp, w.end(), int8_t(0));  // padded channels
        DevBuf dx(x), dw(w), dc(size_t(m * np) * 4);
        if (m > cuda::kGemvMaxRows) {
            lt.gemm_i8(dc.get<int32_t>(), np, dx.get<int8_t>(), kp, dw.get<int8_t>(), kp, m, np, kp, nullptr);
        } else if (!lt.try_gemm_i8(dc.get<int32_t>(), np, dx.get<int8_t>(), kp, dw.get<int8_t>(), kp, m, np, kp,
                                   nullptr)) {
            MESSAGE("cuBLASLt has no int8 algorithm for m=" << m << " n=" << np << " k=" << kp
                                                            << " (the backend runs the GEMV there)");
            continue;
        }
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

TEST_CASE("cuda int8 GEMM: autotuned and first-candidate algorithms give identical int32" *
          doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    cuda::LtGemm tuned;  // autotune on (the default)
    cuda::LtGemm first(no_autotune());
    CHECK(tuned.options().autotune);
    CHECK_FALSE(first.options().autotune);
    for (auto [m, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{17, 100, 200}, {64, 256, 512}, {300, 96, 1024}, {24, 48, 4096}}) {
        INFO("m=" << m << " n=" << n << " k=" << k);
        const I8Gemm g(rng, m, n, k);
        DevBuf dx(g.x), dw(g.w), c1(size_t(m * g.np) * 4), c2(size_t(m * g.np) * 4);
        g.run(tuned, c1.get<int32_t>(), dx, dw, nullptr);
        g.run(first, c2.get<int32_t>(), dx, dw, nullptr);
        const std::vector<int32_t> r1 = c1.download<int32_t>(g.ref.size()), r2 = c2.download<int32_t>(g.ref.size());
        CHECK(r1 == g.ref);
        CHECK(r2 == g.ref);
        CHECK(r1 == r2);
        const cuda::LtAlgoInfo& a = tuned.last_algo();
        INFO("tuned: index " << a.index << " of " << a.candidates << ", algo " << a.algo_id << ", tile " << a.tile
                             << ", splitk " << a.splitk << ", " << a.time_us << " us, dropped " << a.dropped);
        CHECK(a.candidates >= 1);
        CHECK(a.index >= 0);
        CHECK(a.index < a.candidates);
        CHECK(a.timed == (a.candidates > 1));  // a fresh plan, an eager stream: timed whenever there is a choice
        if (a.timed) CHECK(a.time_us > 0.0f);
        const cuda::LtAlgoInfo& b = first.last_algo();
        CHECK_FALSE(b.timed);
        CHECK(b.index == b.dropped);  // the heuristic's first pick unless refused (then the next, in order)
    }
    CHECK(tuned.plans_built() == 4);
    CHECK(first.plans_built() == 4);
    CHECK(first.plans_timed() == 0);
}

TEST_CASE("cuda int8 GEMM: the plan cache builds each shape once and times it once" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    cuda::LtGemm lt;
    CHECK(lt.last_algo().index == -1);
    const I8Gemm g(rng, 33, 100, 200);
    const size_t bytes = g.ref.size() * 4;
    DevBuf dx(g.x), dw(g.w), dc(bytes), dc2(bytes + 16);
    g.run(lt, dc.get<int32_t>(), dx, dw, nullptr);
    CHECK(dc.download<int32_t>(g.ref.size()) == g.ref);
    REQUIRE(lt.plans_built() == 1);
    const int64_t timed = lt.plans_timed();
    CHECK(timed == (lt.last_algo().candidates > 1 ? 1 : 0));
    const cuda::LtAlgoInfo chosen = lt.last_algo();
    for (int rep = 0; rep < 3; ++rep) {
        dc.poison();
        g.run(lt, dc.get<int32_t>(), dx, dw, nullptr);
        CHECK(dc.download<int32_t>(g.ref.size()) == g.ref);
        CHECK(lt.plans_built() == 1);      // cache hit: no heuristic query
        CHECK(lt.plans_timed() == timed);  // and no timing
        CHECK(lt.last_algo().index == chosen.index);
        CHECK(lt.last_algo().algo_id == chosen.algo_id);
    }
    // 16- but not 256-byte aligned output: another alignment class, its own plan (and correct).
    g.run(lt, dc2.get<int32_t>() + 4, dx, dw, nullptr);
    std::vector<int32_t> c2 = dc2.download<int32_t>(g.ref.size() + 4);
    CHECK(std::vector<int32_t>(c2.begin() + 4, c2.end()) == g.ref);
    CHECK(lt.plans_built() == 2);
    // Back to the first shape: still cached.
    g.run(lt, dc.get<int32_t>(), dx, dw, nullptr);
    CHECK(lt.plans_built() == 2);
    CHECK(lt.last_algo().index == chosen.index);
}

TEST_CASE("cuda int8 GEMM: a shape first seen during graph capture" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    cudaStream_t s = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const I8Gemm g(rng, 48, 64, 256);
    DevBuf dx(g.x), dw(g.w), dc(g.ref.size() * 4);
    {
        // Load the heuristic's first pick eagerly (the engine warms every shape up before capture).
        cuda::LtGemm warm(no_autotune());
        g.run(warm, dc.get<int32_t>(), dx, dw, s);
        CUDA_OK(cudaStreamSynchronize(s));
    }
    cuda::LtGemm lt;  // autotune on, but the shape's first use is inside the capture: no timing
    dc.poison();
    CUDA_OK(cudaDeviceSynchronize());  // the poisoning (legacy stream) is done before s runs anything
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    std::string error;
    try {
        g.run(lt, dc.get<int32_t>(), dx, dw, s);
    } catch (const std::exception& e) {
        error = e.what();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    INFO(error);
    REQUIRE(error.empty());
    REQUIRE(end == cudaSuccess);
    CHECK(lt.plans_built() == 1);
    CHECK(lt.plans_timed() == 0);
    CHECK_FALSE(lt.last_algo().timed);
    CHECK(lt.last_algo().index == lt.last_algo().dropped);
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(dc.download<int32_t>(g.ref.size()) == g.ref);
    // The choice is final: eager calls of the shape neither plan nor time again.
    dc.poison();
    CUDA_OK(cudaDeviceSynchronize());
    g.run(lt, dc.get<int32_t>(), dx, dw, s);
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(dc.download<int32_t>(g.ref.size()) == g.ref);
    CHECK(lt.plans_built() == 1);
    CHECK(lt.plans_timed() == 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
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
            check_close(from_act(dy.download<uint16_t>(size_t(m * n)), act), ref, m, n, act);
        }
    }
}

TEST_CASE("cuda W8A8 GEMV (dp4a) and the dequant epilogue are exact for m = 1..16" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : {DType::kF16, DType::kBF16}) {
        // Odd n (a partial last channel group and block); k padded to 16 (the GEMV runs over the
        // padded k, as the backend calls it); k long enough for 1, 2, 4 and 8 k-slices.
        for (auto [n, k] : {std::pair<int64_t, int64_t>{37, 90}, {300, 90}, {37, 3000}, {5, 5000}, {37, 8190}}) {
            const int64_t kp = pad16(k);
            for (int64_t m = 1; m <= cuda::kGemvMaxRows; ++m) {
                INFO(dtype_name(act) << " m=" << m << " n=" << n << " k=" << k);
                std::vector<int8_t> x = random_i8(rng, m, k, kp), w = random_i8(rng, n, k, kp);
                std::vector<float> sx = random_vec(rng, size_t(m), 0.01f, 0.05f),
                                   sw = random_vec(rng, size_t(n), 0.001f, 0.01f);
                DevBuf dx(x), dw(w), dsx(sx), dsw(sw), dy(size_t(m * n) * 2);
                cuda::gemv_w8a8(dy.get(), dx.get<int8_t>(), kp, dsx.get<float>(), dw.get<int8_t>(), kp,
                                dsw.get<float>(), m, n, kp, act, act, nullptr);
                std::vector<float> got = from_act(dy.download<uint16_t>(size_t(m * n)), act);
                std::vector<int32_t> acc(static_cast<size_t>(m * n));
                bool nonzero = false;
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < n; ++j) {
                        acc[size_t(i * n + j)] = dot_i8(&x[size_t(i * kp)], &w[size_t(j * kp)], kp);
                        nonzero |= acc[size_t(i * n + j)] != 0;
                        REQUIRE(got[size_t(i * n + j)] ==
                                round_act(float(acc[size_t(i * n + j)]) * (sx[size_t(i)] * sw[size_t(j)]), act));
                    }
                CHECK(nonzero);
                // Epilogue of the IMMA path on the same accumulators (ld > n): identical numbers.
                DevBuf dacc(acc), dy2(size_t(m * n) * 2);
                cuda::dequant_i32(dy2.get(), dacc.get<int32_t>(), n, dsx.get<float>(), dsw.get<float>(), m, n, act, act,
                                  nullptr);
                CHECK(from_act(dy2.download<uint16_t>(size_t(m * n)), act) == got);
                // f32 outputs (LM-head logits): the unrounded products, identical on both paths.
                DevBuf df1(size_t(m * n) * 4), df2(size_t(m * n) * 4);
                cuda::gemv_w8a8(df1.get(), dx.get<int8_t>(), kp, dsx.get<float>(), dw.get<int8_t>(), kp,
                                dsw.get<float>(), m, n, kp, act, DType::kF32, nullptr);
                cuda::dequant_i32(df2.get(), dacc.get<int32_t>(), n, dsx.get<float>(), dsw.get<float>(), m, n, act,
                                  DType::kF32, nullptr);
                std::vector<float> f1 = df1.download<float>(size_t(m * n));
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < n; ++j)
                        REQUIRE(f1[size_t(i * n + j)] ==
                                float(acc[size_t(i * n + j)]) * (sx[size_t(i)] * sw[size_t(j)]));
                CHECK(df2.download<float>(size_t(m * n)) == f1);
            }
        }
    }
}

TEST_CASE("cuda W8A8 GEMV rejects m outside 1..16 and unpadded k" * doctest::test_suite("cuda")) {
    DevBuf dx(size_t(17 * 32)), dw(size_t(8 * 32)), ds(size_t(17 * 4)), dy(size_t(17 * 8 * 4));
    for (int64_t m : {int64_t(0), int64_t(cuda::kGemvMaxRows + 1)})
        CHECK_THROWS(cuda::gemv_w8a8(dy.get(), dx.get<int8_t>(), 32, ds.get<float>(), dw.get<int8_t>(), 32,
                                     ds.get<float>(), m, 8, 32, DType::kF16, DType::kF16, nullptr));
    CHECK_THROWS(cuda::gemv_w8a8(dy.get(), dx.get<int8_t>(), 32, ds.get<float>(), dw.get<int8_t>(), 32, ds.get<float>(),
                                 1, 8, 24, DType::kF16, DType::kF16, nullptr));
    CHECK_THROWS(cuda::gemv_w8a8(dy.get(), dx.get<int8_t>() + 1, 32, ds.get<float>(), dw.get<int8_t>(), 32,
                                 ds.get<float>(), 1, 8, 32, DType::kF16, DType::kF16, nullptr));
}

TEST_CASE("cuda W8A16 GEMV for m = 1..16: vector and any-k activation paths" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : {DType::kF16, DType::kBF16}) {
        // k % 4 == 0 takes the 8-byte vector path (100, 1000, 8200: a partial last 16-chunk; 4096,
        // 8200: several k-slices); k = 90 and an x misaligned by one element take the any-k path.
        for (auto [n, k, offset] : {std::tuple<int64_t, int64_t, int64_t>{37, 100, 0},
                                    {37, 90, 0},
                                    {300, 1000, 0},
                                    {37, 4096, 0},
                                    {5, 8200, 0},
                                    {37, 100, 1}}) {
            const int64_t kp = pad16(k);
            for (int64_t m = 1; m <= cuda::kGemvMaxRows; ++m) {
                INFO(dtype_name(act) << " m=" << m << " n=" << n << " k=" << k << " x offset " << offset);
                std::vector<int8_t> w = random_i8(rng, n, k, kp);
                std::vector<float> sw = random_vec(rng, size_t(n), 0.001f, 0.01f), x = random_vec(rng, size_t(m * k));
                for (auto& e : x) e = round_act(e, act);
                std::vector<uint16_t> xh = to_act(x, act);
                xh.insert(xh.begin(), size_t(offset), uint16_t(0));
                DevBuf dx(xh), dw(w), dsw(sw), dy(size_t(m * n) * 2), dyf(size_t(m * n) * 4);
                const void* xp = dx.get<uint16_t>() + offset;
                cuda::gemv_w8a16(dy.get(), xp, dw.get<int8_t>(), kp, dsw.get<float>(), m, n, k, act, act, nullptr);
                cuda::gemv_w8a16(dyf.get(), xp, dw.get<int8_t>(), kp, dsw.get<float>(), m, n, k, act, DType::kF32,
                                 nullptr);
                std::vector<float> ref(static_cast<size_t>(m * n));
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < n; ++j) {
                        double s = 0;
                        for (int64_t t = 0; t < k; ++t) s += double(x[size_t(i * k + t)]) * w[size_t(j * kp + t)];
                        ref[size_t(i * n + j)] = float(s * sw[size_t(j)]);
                    }
                CHECK(any_nonzero(ref));
                check_close(from_act(dy.download<uint16_t>(size_t(m * n)), act), ref, m, n, act);
                const std::vector<float> yf = dyf.download<float>(size_t(m * n));
                // fp32 out: no output rounding, so only (b) of cuda_test_util.h: exact products (act-dtype x
                // int8), fp32 partial sums per lane then a tree over lanes and k-slices. A single sequential
                // fp32 sum of k = 8200 random terms, the worst order, errs ~2^-24 sqrt(k) / 2 = 3e-6 of the
                // row's largest output (x3 for the worst of 16 x 37 elements: 9e-6); the GEMV's lane-parallel
                // order is ~sqrt(32) better. Then one fp32 multiply by sw (6e-8).
                CHECK(rel_err(yf, ref) < 1e-5);
                CHECK(max_row_err(yf, ref, m, n) < 1e-5);
            }
        }
    }
}

// The tensor-core W8A16 GEMM of m > 16 (prefill, large batches) against a float64 reference: m not a
// multiple of the 64-row tile, n not one of the 128-column tile, k not one of the 32-wide step (and
// k = 70: the element-wise x path, as is an x misaligned by one element), f16 and bf16, output in the
// activation dtype and in f32.
TEST_CASE("cuda W8A16 GEMM (tensor cores) for m > 16 equals the float64 reference" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : {DType::kF16, DType::kBF16}) {
        for (auto [m, n, k, offset] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{17, 37, 96, 0},
                                       {64, 128, 64, 0},
                                       {100, 300, 200, 0},
                                       {130, 45, 70, 0},
                                       {33, 257, 1040, 1}}) {
            INFO(dtype_name(act) << " m=" << m << " n=" << n << " k=" << k << " x offset " << offset);
            const int64_t kp = pad16(k);
            std::vector<int8_t> w = random_i8(rng, n, k, kp);
            std::vector<float> sw = random_vec(rng, size_t(n), 0.001f, 0.01f), x = random_vec(rng, size_t(m * k));
            for (auto& e : x) e = round_act(e, act);
            std::vector<uint16_t> xh = to_act(x, act);
            xh.insert(xh.begin(), size_t(offset), uint16_t(0));
            DevBuf dx(xh), dw(w), dsw(sw), dy(size_t(m * n) * 2), dyf(size_t(m * n) * 4);
            const void* xp = dx.get<uint16_t>() + offset;
            cuda::gemm_w8a16(dy.get(), xp, dw.get<int8_t>(), kp, dsw.get<float>(), m, n, k, act, act, nullptr);
            cuda::gemm_w8a16(dyf.get(), xp, dw.get<int8_t>(), kp, dsw.get<float>(), m, n, k, act, DType::kF32, nullptr);
            CUDA_OK(cudaGetLastError());
            std::vector<float> ref(static_cast<size_t>(m * n));
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    double s = 0;
                    for (int64_t t = 0; t < k; ++t) s += double(x[size_t(i * k + t)]) * w[size_t(j * kp + t)];
                    ref[size_t(i * n + j)] = float(s * sw[size_t(j)]);
                }
            REQUIRE(any_nonzero(ref));
            check_close(from_act(dy.download<uint16_t>(size_t(m * n)), act), ref, m, n, act);
            // fp32 out: exact products, fp32 sums in the tensor cores' order. Tensor-core accumulation is not
            // IEEE round-to-nearest (products are aligned to the largest exponent of each k-step and
            // truncated): up to 2^-23 of the partial sum per 16-wide k-step, k = 1040 is 65 steps, so a
            // worst-case 65 x 1.2e-7 = 7.7e-6 relative to the partial sums' scale, ~3e-5 of a row's largest
            // output with sqrt(k) cancellation; 1e-4 is 3x over that pessimistic sum.
            const std::vector<float> yf = dyf.download<float>(size_t(m * n));
            CHECK(rel_err(yf, ref) < 1e-4);
            CHECK(max_row_err(yf, ref, m, n) < 1e-4);
        }
    }
}
