// The bf16-dot attention math (kernels/cpu/attention_internal.h, TileKernels::bf16_dot): on a CPU with
// AVX512_BF16 at the avx512 level, a bf16 cache read in place (block 16, head_dim a multiple of 16) runs q . k
// and p . v as vdpbf16ps, with the queries and the softmax weights rounded to bf16. Checked against a
// double-precision softmax over the stored k / v and the bf16-rounded queries (a pairing or lane mix-up is far
// outside the weights' rounding), against the widened math of the avx2 level (close, and not equal: the dot
// ran), a prompt in one call against the same tokens one at a time (bit-identical), with the cache's unwritten
// rows NaN (the row past an odd tile end is read as zeros, never multiplied in). Head dims 64 and 128 (each
// compiled for its size) and 80 (the run-time form, column passes with a remainder), a group of 15 query heads
// (register blocks of 8, 4, 2 and 1 rows), a window, a softcap (Gemma-2's scores through tanh).
// SKIP where the CPU has no AVX512_BF16 or the level is capped below avx512.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/test_skip.h"

using namespace lattice;

namespace {

struct Setup {
    int64_t hd, nh = 30, nkv = 2, block = 16, n = 41, window = 0;
    float softcap = 0.0f;
    int64_t width() const { return (n + block - 1) / block; }
    int64_t blocks() const { return width() + 3; }
    int64_t row() const { return (nh + 2 * nkv) * hd; }
};

// attention over a fresh bf16 cache whose bytes are all 0xff (NaN), the whole prompt in one call or one token
// a call.
std::vector<float> run(const Setup& s, const std::vector<float>& qkv, bool one_by_one, ThreadPool& pool) {
    std::vector<int32_t> table(size_t(s.width()));
    for (int64_t b = 0; b < s.width(); ++b) table[size_t(b)] = int32_t((b * 5 + 2) % s.blocks());
    cpu::AttentionArgs a{s.nh,     s.nkv,        s.hd,
                         s.block,  s.blocks(),   table.data(),
                         1,        s.width(),    1.0f / std::sqrt(float(s.hd)),
                         s.window, DType::kBF16, s.softcap};
    const size_t bytes = size_t(s.blocks() * s.block * s.nkv * cpu::kv_row_bytes(DType::kBF16, s.hd));
    std::vector<uint8_t> kc(bytes, 0xff), vc(bytes, 0xff);
    std::vector<int32_t> pos(size_t(s.n)), seq(size_t(s.n), 0);
    for (int64_t t = 0; t < s.n; ++t) pos[size_t(t)] = int32_t(t);
    std::vector<float> out(size_t(s.n * s.nh * s.hd), std::nanf(""));
    if (!one_by_one)
        cpu::attention(out.data(), qkv.data(), kc.data(), vc.data(), pos.data(), seq.data(), s.n, a, pool);
    else
        for (int64_t t = 0; t < s.n; ++t)
            cpu::attention(out.data() + t * s.nh * s.hd, qkv.data() + t * s.row(), kc.data(), vc.data(),
                           &pos[size_t(t)], &seq[size_t(t)], 1, a, pool);
    return out;
}

float round_bf16(float x) {
    return bf16_to_f32(f32_to_bf16(x));
}

// Query head h of token t in double: scores of bf16(q * scale) against the bf16 keys, softmax, bf16 values.
std::vector<double> reference(const Setup& s, const std::vector<float>& qkv, int64_t t, int64_t h) {
    const int64_t g = h / (s.nh / s.nkv), first = s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
    const float scale = 1.0f / std::sqrt(float(s.hd));
    std::vector<double> sc;
    double mx = -1e300;
    for (int64_t u = first; u <= t; ++u) {
        double d = 0;
        for (int64_t i = 0; i < s.hd; ++i)
            d += double(round_bf16(qkv[size_t(t * s.row() + h * s.hd + i)] * scale)) *
                 round_bf16(qkv[size_t(u * s.row() + (s.nh + g) * s.hd + i)]);
        if (s.softcap > 0) d = s.softcap * std::tanh(d / s.softcap);
        sc.push_back(d);
        mx = std::max(mx, d);
    }
    double sum = 0;
    for (double& e : sc) sum += (e = std::exp(e - mx));
    std::vector<double> o(size_t(s.hd), 0.0);
    for (int64_t i = 0; i < s.hd; ++i)
        for (int64_t u = first; u <= t; ++u)
            o[size_t(i)] +=
                sc[size_t(u - first)] / sum * round_bf16(qkv[size_t(u * s.row() + (s.nh + s.nkv + g) * s.hd + i)]);
    return o;
}

}  // namespace

TEST_CASE("attention [bf16dot]: a bf16 cache's q . k and p . v in bf16 pairs, close to the widened math") {
    if (!cpu_features().avx512bf16) LATTICE_SKIP("this CPU has no AVX512_BF16: bf16 caches run the widened math");
    const std::vector<IsaLevel> levels = test::supported_isas();
    if (std::find(levels.begin(), levels.end(), IsaLevel::kAvx512Vnni) == levels.end())
        LATTICE_SKIP("the avx512 level is not run here (LATTICE_ISA caps it)");
    ThreadPool pool(2, false);
    for (const int64_t hd : {int64_t(64), int64_t(80), int64_t(128)})
        for (const int64_t window : {int64_t(0), int64_t(9)})
            for (const float softcap : {0.0f, 2.5f}) {
                CAPTURE(hd);
                CAPTURE(window);
                CAPTURE(softcap);
                Setup s{hd};
                s.window = window;
                s.softcap = softcap;
                std::mt19937 rng(7);
                std::uniform_real_distribution<float> u(-3.0f, 3.0f);
                std::vector<float> qkv(size_t(s.n * s.row()));
                for (float& x : qkv) x = u(rng);
                std::vector<float> dot, widened, one;
                {
                    test::IsaOverride o(IsaLevel::kAvx512Vnni);
                    dot = run(s, qkv, false, pool);
                    one = run(s, qkv, true, pool);
                }
                {
                    test::IsaOverride o(IsaLevel::kAvx2);
                    widened = run(s, qkv, false, pool);
                }
                CHECK(std::memcmp(dot.data(), one.data(), dot.size() * sizeof(float)) == 0);
                double worst = 0, moved = 0;
                for (size_t i = 0; i < dot.size(); ++i) {
                    REQUIRE(std::isfinite(dot[i]));
                    worst = std::max(worst, double(std::fabs(dot[i] - widened[i])));
                    moved += dot[i] != widened[i];
                }
                CHECK(worst < 0.06);              // the queries' and weights' bf16 rounding, values up to 3
                CHECK(moved > dot.size() / 2.0);  // the queries' rounding moved most outputs: the dot math ran
                double err = 0;
                for (int64_t t : {int64_t(0), int64_t(1), int64_t(15), int64_t(16), int64_t(30), int64_t(40)})
                    for (int64_t h = 0; h < s.nh; h += 7) {
                        const std::vector<double> ref = reference(s, qkv, t, h);
                        for (int64_t i = 0; i < hd; ++i)
                            err = std::max(err, std::fabs(dot[size_t((t * s.nh + h) * hd + i)] - ref[size_t(i)]));
                    }
                CHECK(err < 0.01);  // the weights' rounding only
                MESSAGE("head_dim ", hd, ", window ", window, ", softcap ", softcap,
                        ": bf16-dot vs widened max |diff| ", worst, ", vs the double reference ", err);
            }
}
