// The families' row kernels (kernels/cuda/rows.cu) against the CPU ops, f16 and bf16: add_bias
// against cpu::add_bias_rows; gather_rows and scatter_add_rows against the CPU backend's loops (copy;
// cpu::axpy per row), with odd sizes, m = 1, poisoned outputs (unwritten gathered rows show as NaN),
// rows of the destination no index names left bit for bit, and out-of-range indices (a zero row from
// gather, nothing from scatter) that the host never sends but the kernels must survive.
#include <algorithm>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/kernels.h"
#include "tests/kernels/cuda/cuda_test_util.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_cuda_rows {

using namespace lattice;
using namespace lattice::test;

namespace {
const DType kActs[] = {DType::kF16, DType::kBF16};
}  // namespace

TEST_CASE("cuda add_bias equals cpu::add_bias_rows up to one rounding" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs) {
        for (auto [m, n] : {std::pair<int64_t, int64_t>{1, 7}, {5, 384}, {3, 1000}}) {
            INFO(dtype_name(act) << " m=" << m << " n=" << n);
            std::vector<float> x = random_vec(rng, size_t(m * n), -3, 3), bias = random_vec(rng, size_t(n), -1, 1);
            for (auto& v : x) v = round_act(v, act);
            REQUIRE(any_nonzero(bias));
            DevBuf dx(to_act(x, act)), db(bias);
            cuda::add_bias(dx.get(), db.get<float>(), m, n, act, nullptr);
            std::vector<float> ref = x;
            cpu::add_bias_rows(ref.data(), bias.data(), m, n);
            for (auto& v : ref) v = round_act(v, act);  // fp32 sum, one rounding: exact
            CHECK(from_act(dx.download<uint16_t>(size_t(m * n)), act) == ref);
        }
    }
}

TEST_CASE("cuda gather_rows and scatter_add_rows: an expert's rows out and its weighted outputs back" *
          doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs) {
        for (auto [t, n, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 64}, {9, 4, 100}, {37, 20, 2048}}) {
            INFO(dtype_name(act) << " tokens=" << t << " rows=" << n << " cols=" << cols);
            // n distinct tokens of t, in a random order (an expert's tokens, grouped by the router).
            std::vector<int32_t> all(static_cast<size_t>(t));
            std::iota(all.begin(), all.end(), 0);
            std::shuffle(all.begin(), all.end(), rng);
            std::vector<int32_t> rows(all.begin(), all.begin() + n);
            std::vector<float> src = random_vec(rng, size_t(t * cols), -2, 2), w = random_vec(rng, size_t(n), 0, 1);
            for (auto& v : src) v = round_act(v, act);
            DevBuf dsrc(to_act(src, act)), drows(rows), dw(w), dgather(size_t((n + 1) * cols) * 2);
            cuda::gather_rows(dgather.get(), dsrc.get(), drows.get<int32_t>(), n, t, cols, act, nullptr);
            std::vector<float> got = from_act(dgather.download<uint16_t>(size_t((n + 1) * cols)), act);
            for (int64_t i = 0; i < n; ++i)
                CHECK(std::equal(got.begin() + i * cols, got.begin() + (i + 1) * cols,
                                 src.begin() + int64_t(rows[size_t(i)]) * cols));
            CHECK(std::isnan(got[size_t(n * cols)]));  // the row past n stays untouched (poisoned)

            // The expert's outputs (n rows) added back into a residual-like [t, cols].
            std::vector<float> y = random_vec(rng, size_t(n * cols), -2, 2), dst = random_vec(rng, size_t(t * cols));
            for (auto* v : {&y, &dst})
                for (auto& x : *v) x = round_act(x, act);
            DevBuf dy(to_act(y, act)), ddst(to_act(dst, act));
            cuda::scatter_add_rows(ddst.get(), dy.get(), drows.get<int32_t>(), dw.get<float>(), n, t, cols, act,
                                   nullptr);
            std::vector<float> ref = dst;
            for (int64_t i = 0; i < n; ++i)
                cpu::axpy(ref.data() + int64_t(rows[size_t(i)]) * cols, w[size_t(i)], y.data() + i * cols, cols);
            std::vector<float> out = from_act(ddst.download<uint16_t>(size_t(t * cols)), act);
            // One fma and one output rounding per element: <= u + 2^-24 (cuda_test_util.h (a), (b)), i.e.
            // 4.9e-4 f16 / 3.9e-3 bf16, against tol / 4 = 1e-3 / 7.5e-3: 2x over the worst case.
            CHECK(rel_err(out, ref) < tol_for(act) / 4);
            for (int64_t r = 0; r < t; ++r) {             // tokens no row names: bit for bit
                if (std::find(rows.begin(), rows.end(), int32_t(r)) != rows.end()) continue;
                CHECK(std::equal(out.begin() + r * cols, out.begin() + (r + 1) * cols, dst.begin() + r * cols));
            }
        }
        // Indices outside the tensor: gather writes a zero row, scatter leaves dst alone.
        const int64_t t = 3, cols = 16;
        std::vector<float> src = random_vec(rng, size_t(t * cols), 0.5f, 1.0f);
        for (auto& v : src) v = round_act(v, act);
        std::vector<int32_t> bad = {-1, 3, 1};
        DevBuf dsrc(to_act(src, act)), dbad(bad), dg(size_t(3 * cols) * 2), dw(std::vector<float>{1, 1, 1});
        cuda::gather_rows(dg.get(), dsrc.get(), dbad.get<int32_t>(), 3, t, cols, act, nullptr);
        std::vector<float> g = from_act(dg.download<uint16_t>(size_t(3 * cols)), act);
        CHECK(std::all_of(g.begin(), g.begin() + 2 * cols, [](float x) { return x == 0.0f; }));
        CHECK(std::equal(g.begin() + 2 * cols, g.end(), src.begin() + cols));
        DevBuf ddst(to_act(std::vector<float>(size_t(t * cols), 0.25f), act));
        cuda::scatter_add_rows(ddst.get(), dsrc.get(), dbad.get<int32_t>(), dw.get<float>(), 2, t, cols, act, nullptr);
        std::vector<float> d = from_act(ddst.download<uint16_t>(size_t(t * cols)), act);
        CHECK(std::all_of(d.begin(), d.end(), [](float x) { return x == 0.25f; }));
    }
}

}  // namespace test_cuda_rows
