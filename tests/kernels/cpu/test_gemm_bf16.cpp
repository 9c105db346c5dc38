// The bf16-pair float GEMM (kernels/cpu/gemm_bf16.h, the CPU's `--dtype bf16`): against a double-precision sum of
// the bf16-rounded x and the bf16 weights (a pairing, lane or tail mix-up is far outside f32 rounding), against
// the widened f32 math on the same weights (close, and not equal: x was rounded, the dot ran), and the same rows
// computed alone, in other batches and on another thread count (bit-identical: one fixed order per output).
// Shapes with k below, at and past multiples of 32 (the weights' masked tail), n and m not multiples of the 4 x 4
// tile, m past the decode bound. Refused where it cannot run. SKIP where the CPU has no AVX512_BF16 or the level is
// capped below avx512.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_f32.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/test_skip.h"

using namespace lattice;

namespace {

struct Case {
    std::vector<float> x;     // [m, k]
    std::vector<uint16_t> w;  // [n, k] bf16
    int64_t m, k, n;
};

Case make_case(int64_t m, int64_t k, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    Case c{std::vector<float>(size_t(m * k)), std::vector<uint16_t>(size_t(n * k)), m, k, n};
    for (float& v : c.x) v = d(rng);
    for (uint16_t& v : c.w) v = f32_to_bf16(0.05f * d(rng));
    return c;
}

void skip_unless_available() {
    if (!cpu_features().avx512bf16) LATTICE_SKIP("this CPU has no AVX512_BF16: --dtype bf16 runs the widened math");
    const std::vector<IsaLevel> levels = test::supported_isas();
    if (std::find(levels.begin(), levels.end(), IsaLevel::kAvx512Vnni) == levels.end())
        LATTICE_SKIP("the avx512 level is not run here (LATTICE_ISA caps it)");
}

std::vector<float> run(const Case& c, const PackedBf16& w, ThreadPool& pool, int64_t row0 = 0, int64_t rows = -1) {
    if (rows < 0) rows = c.m;
    std::vector<float> y(size_t(rows * c.n + 1), std::nanf(""));
    gemm_bf16_dot(c.x.data() + row0 * c.k, rows, w, y.data(), pool);
    REQUIRE(std::isnan(y.back()));  // nothing written past the outputs (a partial last panel is a masked store)
    y.pop_back();
    return y;
}

}  // namespace

TEST_CASE("gemm_bf16_dot [bf16dot]: bf16(x) . W^T within f32 rounding of a double sum, not the widened math") {
    skip_unless_available();
    ThreadPool pool(2, false);
    struct Shape {
        int64_t m, k, n;
    };
    for (const Shape s : {Shape{1, 8, 5}, Shape{3, 32, 9}, Shape{5, 72, 19}, Shape{37, 576, 70}, Shape{9, 2049, 6},
                          Shape{130, 200, 33}}) {
        CAPTURE(s.m);
        CAPTURE(s.k);
        CAPTURE(s.n);
        const Case c = make_case(s.m, s.k, s.n, uint32_t(s.m * 131 + s.k));
        const PackedBf16 w = pack_bf16_weights(c.w.data(), DType::kBF16, c.n, c.k, &pool);
        const std::vector<float> y = run(c, w, pool);
        std::vector<float> wide(y.size());
        gemm_f32(c.x.data(), c.m, c.k, c.w.data(), DType::kBF16, c.n, wide.data(), pool, IsaLevel::kAvx512Vnni);
        int64_t differ = 0;
        double worst = 0;
        for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < c.n; ++j) {
                double ref = 0, mag = 0;
                for (int64_t p = 0; p < c.k; ++p) {
                    const double t = double(bf16_to_f32(f32_to_bf16(c.x[size_t(i * c.k + p)]))) *
                                     double(bf16_to_f32(c.w[size_t(j * c.k + p)]));
                    ref += t;
                    mag += std::fabs(t);
                }
                const float got = y[size_t(i * c.n + j)];
                REQUIRE(std::isfinite(got));
                // One f32 chain of ceil(k / 2) steps of two exact products: at most two roundings a step.
                const double err = std::fabs(double(got) - ref) / (mag + 1e-30);
                worst = std::max(worst, err);
                CHECK(err < 1.2e-7 * double(c.k / 2 + 2));
                differ += got != wide[size_t(i * c.n + j)];
                // x's rounding moves each product by up to 2^-9 of itself: the two maths stay close.
                CHECK(std::fabs(double(got) - double(wide[size_t(i * c.n + j)])) < 1e-2 * mag + 1e-6);
            }
        MESSAGE("worst error / magnitude ", worst);
        CHECK(differ * 2 > c.m * c.n);  // the dot ran: most outputs differ from the f32 math's
    }
}

TEST_CASE("gemm_bf16_dot [bf16dot]: a row's result does not depend on its batch, the tile or the threads") {
    skip_unless_available();
    ThreadPool two(2, false), one(1, false);
    for (const int64_t k : {int64_t(40), int64_t(576), int64_t(1000)}) {
        CAPTURE(k);
        const Case c = make_case(23, k, 45, uint32_t(k));
        const PackedBf16 w = pack_bf16_weights(c.w.data(), DType::kBF16, c.n, c.k);
        const std::vector<float> all = run(c, w, two);
        REQUIRE(run(c, w, one) == all);      // another thread split
        for (int64_t i = 0; i < c.m; ++i) {  // each row alone (decode's tiles, prefetching)
            const std::vector<float> alone = run(c, w, two, i, 1);
            REQUIRE(std::memcmp(alone.data(), all.data() + i * c.n, size_t(c.n) * sizeof(float)) == 0);
        }
        const std::vector<float> tail = run(c, w, two, 4, 9);  // rows 4..12: tiles of 6 and 3 at other offsets
        REQUIRE(std::memcmp(tail.data(), all.data() + 4 * c.n, tail.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("gemm_bf16_dot: the level decided at packing; refused on a CPU without AVX512_BF16") {
    ThreadPool pool(1, false);
    const Case c = make_case(2, 64, 4, 7);
    const PackedBf16 w = pack_bf16_weights(c.w.data(), DType::kBF16, 4, 64);
    std::vector<float> y(8), before(8);
    const bool cpu = gemm_bf16_dot_available(IsaLevel::kAvx512Vnni);
    CHECK(cpu == (isa_supported(IsaLevel::kAvx512Vnni) && cpu_features().avx512bf16));
    CHECK_FALSE(gemm_bf16_dot_available(IsaLevel::kScalar));
    if (!cpu) {
        CHECK_THROWS_AS(gemm_bf16_dot(c.x.data(), 2, w, y.data(), pool), Error);
        return;
    }
    gemm_bf16_dot(c.x.data(), 2, w, before.data(), pool);
    if (isa_supported(IsaLevel::kAvx2)) {  // an override after packing: new packings decide by it, these run on
        test::IsaOverride cap(IsaLevel::kAvx2);
        CHECK_FALSE(gemm_bf16_dot_available());
        gemm_bf16_dot(c.x.data(), 2, w, y.data(), pool);
        CHECK(y == before);
    }
}

TEST_CASE("pack_bf16_weights: f32 and f16 rows rounded as f32_to_bf16, pairs interleaved, zeros past n and k") {
    const int64_t n = 19, k = 7;  // a partial panel, an odd k
    std::vector<float> f(size_t(n * k));
    std::vector<uint16_t> h(f.size()), b(f.size());
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (size_t i = 0; i < f.size(); ++i) {
        h[i] = f32_to_f16(d(rng));
        f[i] = i == 5 ? std::nanf("") : f16_to_f32(h[i]) * 1.0009765625f;  // not on the bf16 grid
        b[i] = f32_to_bf16(f[i]);
    }
    h[5] = 0x7e00;  // f16 NaN
    ThreadPool pool(2, false);
    const PackedBf16 pf = pack_bf16_weights(f.data(), DType::kF32, n, k, &pool);
    const PackedBf16 pb = pack_bf16_weights(b.data(), DType::kBF16, n, k);
    const PackedBf16 ph = pack_bf16_weights(h.data(), DType::kF16, n, k);
    REQUIRE(pf.n_panels == 2);
    REQUIRE(pf.pairs == 4);
    CHECK(pf.data == pb.data);
    for (int64_t r = 0; r < 2 * kBf16PanelN; ++r)
        for (int64_t c = 0; c < 2 * pf.pairs; ++c) {
            const uint16_t got = pf.panel(r / 16)[(c / 2) * 32 + (r % 16) * 2 + c % 2];
            const uint16_t hv = ph.panel(r / 16)[(c / 2) * 32 + (r % 16) * 2 + c % 2];
            if (r >= n || c >= k) {
                CHECK(got == 0);
                CHECK(hv == 0);
                continue;
            }
            CHECK(got == b[size_t(r * k + c)]);
            if (r * k + c == 5)
                CHECK(std::isnan(bf16_to_f32(hv)));
            else
                CHECK(hv == f32_to_bf16(f16_to_f32(h[size_t(r * k + c)])));
        }
    CHECK_THROWS_AS(pack_bf16_weights(b.data(), DType::kI8, n, k), Error);
}
