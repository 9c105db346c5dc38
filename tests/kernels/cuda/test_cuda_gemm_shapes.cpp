// The INT8 GEMMs at the shapes the models run (cuBLASLt IMMA, int32 out), checked entry by entry on a
// sample: the small cases of test_cuda_gemm stop at 300 x 96 x 1024, far from the tiles, split-k and
// workspace choices cuBLASLt makes at 8192 x 28672. Per shape (m, n, k) of TinyLlama-1.1B and
// Llama-2-70B (qkv, o, gate_up, down, LM head) at m = 32 (a decode bucket) and 512 (a prefill chunk),
// and 4096^3: operands random on the device (fill_random: int8 in [-127, 127]), the output poisoned,
// one call through the autotuned plan, then 40 rows x 40 columns of the int32 result (the first and
// last of each, the rest random) against exact dots on the host from the downloaded operand rows. The
// operands are asserted non-zero. About 20 GEMMs up to 470 MB of weights: seconds on an H200.
#include <algorithm>
#include <tuple>
#include <vector>

#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/kernels.h"
#include "tests/kernels/cuda/cuda_test_util.h"

using namespace lattice;
using namespace lattice::test;

namespace {

struct Shape {
    const char* what;
    int64_t n, k;
};

// The index sample of [0, count): the ends, then random ones (repeats are harmless).
std::vector<int64_t> sample(std::mt19937_64& rng, int64_t count, int64_t want) {
    std::vector<int64_t> v = {0, count - 1};
    while (int64_t(v.size()) < std::min(want, count)) v.push_back(int64_t(rng() % uint64_t(count)));
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
}

std::vector<int8_t> download_rows(const int8_t* dev, int64_t ld, const std::vector<int64_t>& rows, int64_t k) {
    std::vector<int8_t> h(size_t(int64_t(rows.size()) * k));
    for (size_t r = 0; r < rows.size(); ++r)
        CUDA_OK(cudaMemcpy(&h[r * size_t(k)], dev + rows[r] * ld, size_t(k), cudaMemcpyDeviceToHost));
    return h;
}

}  // namespace

TEST_CASE("cuda int8 GEMM at model shapes: sampled int32 entries equal the host's dots" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const Shape shapes[] = {
        {"tinyllama qkv", 2560, 2048},  {"tinyllama o", 2048, 2048},     {"tinyllama gate_up", 11264, 2048},
        {"tinyllama down", 2048, 5632}, {"tinyllama head", 32000, 2048}, {"70b qkv", 10240, 8192},
        {"70b o", 8192, 8192},          {"70b gate_up", 57344, 8192},    {"70b down", 8192, 28672},
        {"70b head", 32000, 8192},
    };
    std::vector<std::tuple<const char*, int64_t, int64_t, int64_t>> runs;  // what, m, n, k
    for (const Shape& s : shapes)
        for (int64_t m : {int64_t(32), int64_t(512)}) runs.emplace_back(s.what, m, s.n, s.k);
    runs.emplace_back("square", 4096, 4096, 4096);
    int64_t max_w = 0, max_x = 0, max_c = 0;
    for (auto& [what, m, n, k] : runs) {
        max_w = std::max(max_w, n * k);
        max_x = std::max(max_x, m * k);
        max_c = std::max(max_c, m * n);
    }
    DevBuf dw{size_t(max_w)}, dx{size_t(max_x)}, dc{size_t(max_c) * 4};
    cuda::LtGemm lt;  // the backend's options: int8 shapes autotuned on first use
    uint64_t fill_seed = seed;
    for (auto& [what, m, n, k] : runs) {
        INFO(what << ": m=" << m << " n=" << n << " k=" << k);
        cuda::fill_random(dw.get(), DType::kI8, n * k, ++fill_seed, 0.0f, nullptr);
        cuda::fill_random(dx.get(), DType::kI8, m * k, ++fill_seed, 0.0f, nullptr);
        dc.poison();
        lt.gemm_i8(dc.get<int32_t>(), n, dx.get<int8_t>(), k, dw.get<int8_t>(), k, m, n, k, nullptr);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        const cuda::LtAlgoInfo& a = lt.last_algo();
        MESSAGE(what << " m=" << m << ": algo " << a.algo_id << " tile " << a.tile << " split-k " << a.splitk
                     << " (heuristic #" << a.index << " of " << a.candidates << (a.timed ? ", timed" : "") << ")");
        const std::vector<int64_t> rows = sample(rng, m, 40), cols = sample(rng, n, 40);
        const std::vector<int8_t> xr = download_rows(dx.get<int8_t>(), k, rows, k);
        const std::vector<int8_t> wr = download_rows(dw.get<int8_t>(), k, cols, k);
        REQUIRE(std::any_of(xr.begin(), xr.end(), [](int8_t v) { return v != 0; }));
        REQUIRE(std::any_of(wr.begin(), wr.end(), [](int8_t v) { return v != 0; }));
        int64_t bad = 0;
        for (size_t i = 0; i < rows.size(); ++i) {
            std::vector<int32_t> crow(static_cast<size_t>(n));
            CUDA_OK(cudaMemcpy(crow.data(), dc.get<int32_t>() + rows[i] * n, size_t(n) * 4, cudaMemcpyDeviceToHost));
            for (size_t j = 0; j < cols.size(); ++j) {
                int32_t dot = 0;
                const int8_t* xp = &xr[i * size_t(k)];
                const int8_t* wp = &wr[j * size_t(k)];
                for (int64_t t = 0; t < k; ++t) dot += int32_t(xp[t]) * int32_t(wp[t]);
                if (crow[size_t(cols[j])] != dot && bad++ < 5)
                    FAIL_CHECK("c[" << rows[i] << ", " << cols[j] << "] = " << crow[size_t(cols[j])] << ", host dot "
                                    << dot);
            }
        }
        CHECK(bad == 0);
    }
}
