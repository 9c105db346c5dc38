// CPU ops against straightforward double-precision references: rmsnorm (+ fused residual add),
// rope (half-split pairs), causal GQA attention over a multi-slot KV cache (f32, f16, bf16 and int8
// rows), silu_mul, embed with a
// vocab-parallel row offset, the sampling log-sum-exp. Odd sizes, several threads, poisoned outputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kernels/common/quantize.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/kv_layout.h"

using namespace lattice;

namespace {
std::vector<float> rand_vec(size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

// The reference for cpu::attention: query head h of token t over the K/V rows of the tokens `src`
// (rows of qkv, [token][(nh + 2 nkv) hd]), a naive softmax in double. Returns head_dim values.
std::vector<double> naive_attention(const std::vector<float>& qkv, int64_t nh, int64_t nkv, int64_t hd, double scale,
                                    int64_t t, int64_t h, const std::vector<int64_t>& src) {
    const int64_t row = (nh + 2 * nkv) * hd, g = h / (nh / nkv);
    std::vector<double> s;
    double mx = -1e300;
    for (int64_t u : src) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
            d += double(qkv[size_t(t * row + h * hd + i)]) * qkv[size_t(u * row + (nh + g) * hd + i)];
        s.push_back(d * scale);
        mx = std::max(mx, s.back());
    }
    double sum = 0;
    for (auto& e : s) sum += (e = std::exp(e - mx));
    std::vector<double> o(size_t(hd), 0.0);
    for (int64_t i = 0; i < hd; ++i)
        for (size_t j = 0; j < src.size(); ++j)
            o[size_t(i)] += s[j] / sum * qkv[size_t(src[j] * row + (nh + nkv + g) * hd + i)];
    return o;
}
}  // namespace

TEST_CASE("rmsnorm and add_rmsnorm") {
    std::mt19937 rng(1);
    ThreadPool pool(3, false);
    for (int64_t n : {1, 15, 64, 97}) {
        const int64_t m = 5;
        auto x = rand_vec(size_t(m * n), rng), w = rand_vec(size_t(n), rng), d = rand_vec(size_t(m * n), rng);
        std::vector<float> out(size_t(m * n), std::nanf(""));
        cpu::rmsnorm(out.data(), x.data(), w.data(), m, n, 1e-5f, pool);
        auto res = x;
        std::vector<float> out2(size_t(m * n), std::nanf(""));
        cpu::add_rmsnorm(res.data(), d.data(), out2.data(), w.data(), m, n, 1e-5f, pool);
        for (int64_t r = 0; r < m; ++r) {
            double ss = 0, ss2 = 0;
            for (int64_t i = 0; i < n; ++i) {
                ss += double(x[size_t(r * n + i)]) * x[size_t(r * n + i)];
                double s = double(x[size_t(r * n + i)]) + d[size_t(r * n + i)];
                ss2 += s * s;
            }
            const double inv = 1 / std::sqrt(ss / double(n) + 1e-5), inv2 = 1 / std::sqrt(ss2 / double(n) + 1e-5);
            for (int64_t i = 0; i < n; ++i) {
                const size_t j = size_t(r * n + i);
                CHECK(out[j] == doctest::Approx(x[j] * inv * w[size_t(i)]).epsilon(1e-5));
                CHECK(res[j] == doctest::Approx(double(x[j]) + d[j]).epsilon(1e-6));
                CHECK(out2[j] == doctest::Approx((double(x[j]) + d[j]) * inv2 * w[size_t(i)]).epsilon(1e-5));
            }
        }
    }
}

TEST_CASE("rope rotates q and k heads in half-split pairs and leaves v alone") {
    std::mt19937 rng(2);
    ThreadPool pool(2, false);
    const int64_t hd = 8, nh = 3, nkv = 1, m = 4, row = (nh + 2 * nkv) * hd;
    auto qkv = rand_vec(size_t(m * row), rng);
    auto orig = qkv;
    std::vector<float> inv = {1.0f, 0.5f, 0.1f, 0.01f};
    std::vector<int32_t> pos = {0, 3, 17, 200};
    cpu::rope(qkv.data(), m, row, pos.data(), nh + nkv, hd, inv.data(), pool);
    for (int64_t t = 0; t < m; ++t) {
        for (int64_t h = 0; h < nh + nkv; ++h)
            for (int64_t i = 0; i < hd / 2; ++i) {
                const double a = double(pos[size_t(t)]) * inv[size_t(i)];
                const double x0 = orig[size_t(t * row + h * hd + i)], x1 = orig[size_t(t * row + h * hd + i + hd / 2)];
                CHECK(qkv[size_t(t * row + h * hd + i)] == doctest::Approx(x0 * std::cos(a) - x1 * std::sin(a)).epsilon(1e-4));
                CHECK(qkv[size_t(t * row + h * hd + i + hd / 2)] ==
                      doctest::Approx(x1 * std::cos(a) + x0 * std::sin(a)).epsilon(1e-4));
            }
        for (int64_t i = (nh + nkv) * hd; i < row; ++i) CHECK(qkv[size_t(t * row + i)] == orig[size_t(t * row + i)]);
    }
}

// A prompt of n tokens (one sequence at positions 0 .. n - 1, its blocks scattered: entry b of the table is
// (b * spread + 1) mod the cache's width + extra blocks) attended in one call and one token at a time, each
// into fresh f32 caches: every row must have the same bits both ways, and rows `check` (heads 0 and nh - 1)
// equal a naive softmax in double over their window. q, k and v are uniform in [-range, range].
// `shape`, when given, rewrites the random qkv rows (row t at t * (nh + 2 nkv) hd) before the calls.
void check_prompt_both_ways(int64_t nh, int64_t nkv, int64_t hd, int64_t n, int64_t window, int64_t spread,
                            int64_t extra, std::initializer_list<int64_t> check, uint32_t seed, ThreadPool& pool,
                            float range = 2.0f, const std::function<void(std::vector<float>&)>& shape = {}) {
    std::mt19937 rng(seed);
    const int64_t block = 16, width = (n + block - 1) / block, row = (nh + 2 * nkv) * hd, blocks = width + extra;
    std::vector<int32_t> table(static_cast<size_t>(width));
    for (int64_t b = 0; b < width; ++b) table[size_t(b)] = int32_t((b * spread + 1) % blocks);
    REQUIRE(std::set<int32_t>(table.begin(), table.end()).size() == table.size());  // no block twice
    auto qkv = rand_vec(size_t(n * row), rng, -range, range);
    if (shape) shape(qkv);
    std::vector<int32_t> pos(static_cast<size_t>(n)), seq(static_cast<size_t>(n), 0);
    std::iota(pos.begin(), pos.end(), 0);
    cpu::AttentionArgs a{nh, nkv, hd, block, blocks, table.data(), 1, width, 1.0f / std::sqrt(float(hd)), window};
    std::vector<float> kc(size_t(blocks * block * nkv * hd), 0.0f), vc = kc;
    std::vector<float> all(size_t(n * nh * hd), std::nanf(""));
    cpu::attention(all.data(), qkv.data(), kc.data(), vc.data(), pos.data(), seq.data(), n, a, pool);
    std::vector<float> kc1(kc.size(), 0.0f), vc1 = kc1, one(all.size(), std::nanf(""));
    for (int64_t t = 0; t < n; ++t)
        cpu::attention(one.data() + t * nh * hd, qkv.data() + t * row, kc1.data(), vc1.data(), &pos[size_t(t)],
                       &seq[size_t(t)], 1, a, pool);
    int64_t differ = 0;
    for (size_t i = 0; i < all.size(); ++i) differ += std::memcmp(&all[i], &one[i], 4) != 0;
    CHECK(differ == 0);
    for (int64_t t : check)
        for (int64_t h : {int64_t(0), nh - 1}) {
            const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
            std::vector<int64_t> src(size_t(t + 1 - first));
            std::iota(src.begin(), src.end(), first);  // the sequence's positions first .. t
            const std::vector<double> o = naive_attention(qkv, nh, nkv, hd, a.scale, t, h, src);
            for (int64_t i = 0; i < hd; ++i)
                CHECK(all[size_t(t * nh * hd + h * hd + i)] == doctest::Approx(o[size_t(i)]).epsilon(1e-4).scale(1.0));
        }
}

TEST_CASE("attention: causal GQA over two sequences of a paged cache equals a naive softmax") {
    std::mt19937 rng(3);
    ThreadPool pool(3, false);
    const int64_t hd = 12, nh = 6, nkv = 2, block = 2, width = 3, blocks = 7;
    const int64_t row = (nh + 2 * nkv) * hd;
    // Sequence 1 gets a 5-token prompt; sequence 0 a 3-token prompt; tokens interleaved in one batch.
    // Blocks of 2 positions, scattered: sequence 0 uses blocks 5, 0; sequence 1 uses 3, 6, 1.
    std::vector<int32_t> pos = {0, 0, 1, 1, 2, 2, 3, 4}, slot = {1, 0, 1, 0, 1, 0, 1, 1};
    const std::vector<int32_t> tables = {5, 0, -1, 3, 6, 1};
    const int64_t m = int64_t(pos.size());
    auto qkv = rand_vec(size_t(m * row), rng, -2, 2);
    std::vector<float> kc(size_t(blocks * block * nkv * hd), 0.0f), vc = kc;
    std::vector<float> out(size_t(m * nh * hd), std::nanf(""));
    cpu::AttentionArgs a{nh, nkv, hd, block, blocks, tables.data(), 2, width, 1.0f / std::sqrt(float(hd))};
    cpu::attention(out.data(), qkv.data(), kc.data(), vc.data(), pos.data(), slot.data(), m, a, pool);
    for (int64_t t = 0; t < m; ++t)
        for (int64_t h = 0; h < nh; ++h) {
            // keys/values of the same slot with position <= pos[t]
            std::vector<int64_t> src;
            for (int64_t u = 0; u < m; ++u)
                if (slot[size_t(u)] == slot[size_t(t)] && pos[size_t(u)] <= pos[size_t(t)]) src.push_back(u);
            const std::vector<double> o = naive_attention(qkv, nh, nkv, hd, a.scale, t, h, src);
            for (int64_t i = 0; i < hd; ++i)
                CHECK(out[size_t(t * nh * hd + h * hd + i)] ==
                      doctest::Approx(o[size_t(i)]).epsilon(1e-4).scale(1.0));
        }
}

TEST_CASE("attention: many tiles, GQA groups of 8 and 6, a prompt in one call equals the same tokens one by one") {
    // head_dim 64 and groups of 8 (4 + 2 for 6) take the register-blocked paths; 75 positions span
    // three 32-position tiles. A prompt attended in one call and the same tokens decoded one at a
    // time must give the same bits (each row's arithmetic is independent of what shares its call).
    // With a sliding window W (Mistral) the query at t attends t - W < j <= t only: W = 5 starts
    // windows inside a tile and skips whole tiles, W = 40 spans a tile boundary.
    for (const int64_t window : {int64_t(0), int64_t(5), int64_t(40)})
    for (const int64_t nh : {8, 12}) {
        CAPTURE(window);
        CAPTURE(nh);
        ThreadPool pool(2, false);
        check_prompt_both_ways(nh, nh / 8 == 1 ? 1 : 2, 64, 75, window, 3, 3, {0, 31, 32, 36, 74}, 11, pool);
    }
}

TEST_CASE("attention: scores far apart (a running max off by more than ~88 overflows or flattens the weights)") {
    // q and k in [-30, 30] at head_dim 64: scores of a row spread over hundreds, so the running max must move
    // (to the tile's exact max) whenever a score passes it by more than the lazy bound (8) for the weights to
    // stay finite and right; the rows must still equal a naive softmax and have the same bits in one call or
    // token by token.
    for (const int64_t window : {int64_t(0), int64_t(20)}) {
        CAPTURE(window);
        ThreadPool pool(2, false);
        check_prompt_both_ways(8, 1, 64, 70, window, 3, 3, {15, 16, 40, 69}, 23, pool, 30.0f);
    }
}

TEST_CASE("attention: scores that climb or fall steadily (the lazy running max kept or moved tile by tile)") {
    // Score(t, j) = slope * j for every query: key j's first element slope * j * sqrt(hd), the query's 1, all
    // else 0. A climb of 4.8 or 7.2 a 16-key tile leaves the max in place for a tile or two (weights up to e^8
    // then) before a score passes it by more than 8; 8.8 moves it every tile; a fall never moves it after the
    // first tile. 300 positions: across a segment (256), where the max starts again. Rows equal a naive softmax
    // and have the same bits in one call or token by token.
    for (const float slope : {0.3f, 0.45f, 0.55f, -0.5f}) {
        CAPTURE(slope);
        const int64_t nh = 8, nkv = 1, hd = 64, row = (nh + 2 * nkv) * hd;
        const auto ramp = [&](std::vector<float>& qkv) {
            for (int64_t t = 0; t < int64_t(qkv.size()) / row; ++t) {
                float* r = qkv.data() + t * row;
                std::fill(r, r + (nh + nkv) * hd, 0.0f);
                for (int64_t h = 0; h < nh; ++h) r[h * hd] = 1.0f;
                r[nh * hd] = slope * float(t) * std::sqrt(float(hd));
            }
        };
        ThreadPool pool(2, false);
        check_prompt_both_ways(nh, nkv, hd, 300, 0, 5, 2, {20, 33, 255, 256, 299}, 31, pool, 1.0f, ramp);
    }
}

TEST_CASE("attention: keys past a segment (256 positions) split among threads give the same bits as one unit") {
    // 600 positions span three segments. One kv head (the 70B shape at TP 8) decoded one token at a time
    // is split by segment among the threads and merged; the same prompt in one call runs 38 units of whole
    // rows. Every row must have the same bits both ways, on 1 and on 3 threads, and equal a naive softmax;
    // with a window (W = 300) the rows past it skip whole segments. On 12 threads a 300-token prompt's 19
    // runs of 16 tokens are split by segment too: the run across position 256 has rows without keys in
    // its second segment.
    for (const int64_t window : {int64_t(0), int64_t(300)})
    for (const int threads : {1, 3}) {
        CAPTURE(window);
        CAPTURE(threads);
        ThreadPool pool(threads, false);
        check_prompt_both_ways(8, 1, 32, 600, window, 7, 2, {255, 256, 300, 511, 599}, 17, pool);
    }
    for (const int64_t window : {int64_t(0), int64_t(100)}) {
        CAPTURE(window);
        ThreadPool pool(12, false);
        check_prompt_both_ways(8, 1, 32, 300, window, 5, 2, {250, 255, 256, 299}, 19, pool);
    }
}

TEST_CASE("attention over f16, bf16 and int8 KV caches: the stored rows' values, bit-identical by chunks") {
    // Each token's k and v are converted (f16, bf16) or quantized (int8: one scale per token and KV head)
    // as they are stored; attention must equal a naive softmax over exactly those values, and a prompt in
    // one call the same tokens one at a time. head_dim 72 is not a multiple of the 16-wide paths.
    // Block 16 reads int8 and bf16 tiles in place (int8: row scales applied to the scores and the weights),
    // block 8 converts them first: both paths.
    for (const DType dt : {DType::kF16, DType::kBF16, DType::kI8})
        for (const int64_t window : {int64_t(0), int64_t(9)})
        for (const int64_t block : {int64_t(8), int64_t(16)}) {
            CAPTURE(dtype_name(dt));
            CAPTURE(window);
            CAPTURE(block);
            std::mt19937 rng(21);
            ThreadPool pool(2, false);
            const int64_t hd = 72, nh = 6, nkv = 2, n = 41, width = (n + block - 1) / block;
            const int64_t row = (nh + 2 * nkv) * hd, blocks = width + 3;  // 5 coprime with it: no block twice
            std::vector<int32_t> table(static_cast<size_t>(width));
            for (int64_t b = 0; b < width; ++b) table[size_t(b)] = int32_t((b * 5 + 2) % blocks);
            auto qkv = rand_vec(size_t(n * row), rng, -3, 3);
            std::vector<int32_t> pos(static_cast<size_t>(n)), seq(static_cast<size_t>(n), 0);
            for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t(t);
            cpu::AttentionArgs a{nh, nkv, hd, block, blocks, table.data(), 1, width, 1.0f / std::sqrt(float(hd)),
                                 window, dt};
            const size_t cache_bytes = size_t(blocks * block * nkv * cpu::kv_row_bytes(dt, hd));
            CHECK(cpu::kv_row_bytes(dt, hd) == (dt == DType::kI8 ? hd + 4 : 2 * hd));
            std::vector<uint8_t> kc(cache_bytes, 0), vc = kc, kc1 = kc, vc1 = kc;
            std::vector<float> all(size_t(n * nh * hd), std::nanf("")), one = all;
            cpu::attention(all.data(), qkv.data(), kc.data(), vc.data(), pos.data(), seq.data(), n, a, pool);
            for (int64_t t = 0; t < n; ++t)
                cpu::attention(one.data() + t * nh * hd, qkv.data() + t * row, kc1.data(), vc1.data(), &pos[size_t(t)],
                               &seq[size_t(t)], 1, a, pool);
            CHECK(std::memcmp(all.data(), one.data(), all.size() * 4) == 0);
            // The reference: k and v heads replaced by the values the cache holds.
            std::vector<float> stored = qkv;
            for (int64_t t = 0; t < n; ++t)
                for (int64_t h = nh; h < nh + 2 * nkv; ++h) {
                    float* x = stored.data() + t * row + h * hd;
                    if (dt == DType::kI8) {
                        std::vector<int8_t> q(static_cast<size_t>(hd));
                        const float sc = quantize_row_int8(x, hd, q.data());
                        for (int64_t i = 0; i < hd; ++i) x[i] = float(q[size_t(i)]) * sc;
                    } else {
                        for (int64_t i = 0; i < hd; ++i)
                            x[i] = dt == DType::kF16 ? f16_to_f32(f32_to_f16(x[i])) : bf16_to_f32(f32_to_bf16(x[i]));
                    }
                }
            for (int64_t t : {int64_t(0), int64_t(7), int64_t(8), int64_t(23), int64_t(40)})
                for (int64_t h : {int64_t(0), int64_t(4)}) {
                    const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
                    std::vector<int64_t> src(size_t(t + 1 - first));
                    std::iota(src.begin(), src.end(), first);
                    // q from the original rows (it is not stored), k / v as stored
                    std::vector<float> mixed = stored;
                    std::copy(qkv.begin() + t * row, qkv.begin() + t * row + nh * hd, mixed.begin() + t * row);
                    const std::vector<double> o = naive_attention(mixed, nh, nkv, hd, a.scale, t, h, src);
                    const std::vector<double> exact = naive_attention(qkv, nh, nkv, hd, a.scale, t, h, src);
                    double err = 0;
                    for (int64_t i = 0; i < hd; ++i) {
                        const float got = all[size_t(t * nh * hd + h * hd + i)];
                        CHECK(got == doctest::Approx(o[size_t(i)]).epsilon(1e-4).scale(1.0));
                        err = std::max(err, std::abs(double(got) - exact[size_t(i)]));
                    }
                    // and close to attention over the unrounded k / v (a scale or row mix-up is not)
                    CHECK(err < (dt == DType::kI8 ? 0.06 : dt == DType::kBF16 ? 0.06 : 0.005));
                }
        }
}

TEST_CASE("attention's cache layout: K transposed, V rows, both per kv head in a block; int8 scales after the values") {
    // Each stored token's k must be where kernels/cpu/ops.h says (tests/kernels/kv_layout.h maps it to the
    // row layout the CUDA tests compare against), v in its row; f32 exactly, int8 as quantize_row_int8.
    const int64_t hd = 8, nh = 4, nkv = 2, bs = 4, n = 6, width = 2, blocks = 3, row = (nh + 2 * nkv) * hd;
    const std::vector<int32_t> table{2, 0};  // positions 0..3 in block 2, 4..5 in block 0
    std::mt19937 rng(5);
    const auto qkv = rand_vec(size_t(n * row), rng, -2, 2);
    std::vector<int32_t> pos(static_cast<size_t>(n)), seq(static_cast<size_t>(n), 0);
    std::iota(pos.begin(), pos.end(), 0);
    ThreadPool pool(1, false);
    std::vector<float> out(size_t(n * nh * hd));
    for (const DType dt : {DType::kF32, DType::kI8}) {
        CAPTURE(dtype_name(dt));
        const int64_t rb = cpu::kv_row_bytes(dt, hd), row_elems = dt == DType::kI8 ? hd + 4 : hd;
        std::vector<uint8_t> kc(size_t(blocks * bs * nkv * rb), 0), vc = kc;
        const cpu::AttentionArgs a{nh, nkv, hd, bs, blocks, table.data(), 1, width, 0.5f, 0, dt};
        cpu::attention(out.data(), qkv.data(), kc.data(), vc.data(), pos.data(), seq.data(), n, a, pool);
        std::vector<uint8_t> krows;
        if (dt == DType::kF32) {
            std::vector<float> kf(kc.size() / 4);
            std::memcpy(kf.data(), kc.data(), kc.size());
            const std::vector<float> r = test::cpu_to_rows(test::KvPart::kK, kf, blocks, bs, nkv, hd);
            CHECK(test::rows_to_cpu(test::KvPart::kK, r, blocks, bs, nkv, hd) == kf);
            krows.resize(kc.size());
            std::memcpy(krows.data(), r.data(), kc.size());
        } else {
            krows = test::cache_layout(test::KvPart::kK, kc, blocks, bs, nkv, hd, row_elems, false);
            CHECK(test::cache_layout(test::KvPart::kK, krows, blocks, bs, nkv, hd, row_elems, true) == kc);
        }
        for (int64_t t = 0; t < n; ++t)
            for (int64_t g = 0; g < nkv; ++g)
                for (int kv = 0; kv < 2; ++kv) {
                    CAPTURE(t);
                    CAPTURE(g);
                    CAPTURE(kv);
                    const std::vector<uint8_t>& c = kv == 0 ? krows : vc;
                    // the row of (position, kv head): K (as rows) position-major, V kv-head-major; the
                    // int8 scales position-major for both
                    const int64_t block = table[size_t(t / bs)], r = (t % bs) * nkv + g;
                    const int64_t vr = kv == 0 ? r : g * bs + t % bs;
                    const float* x = qkv.data() + t * row + (nh + kv * nkv + g) * hd;
                    const uint8_t* at = c.data() + block * bs * nkv * rb;
                    if (dt == DType::kF32) {
                        CHECK(std::memcmp(at + vr * hd * 4, x, size_t(hd) * 4) == 0);
                    } else {
                        std::vector<int8_t> q(static_cast<size_t>(hd));
                        const float scale = quantize_row_int8(x, hd, q.data());
                        CHECK(std::memcmp(at + vr * hd, q.data(), size_t(hd)) == 0);
                        float stored;
                        std::memcpy(&stored, at + bs * nkv * hd + r * 4, 4);
                        CHECK(stored == scale);
                    }
                }
        (void)row_elems;
    }
}

TEST_CASE("attention rejects positions beyond the block tables and blocks outside the cache") {
    ThreadPool pool(1, false);
    std::vector<float> qkv(3 * 4, 0.0f), kc(2 * 2 * 4, 0.0f), vc = kc, out(4, 0.0f);
    std::vector<int32_t> tables = {0, 1};  // one sequence, 2 blocks of 2 positions
    int32_t pos = 4, seq = 0;
    cpu::AttentionArgs a{1, 1, 4, 2, 2, tables.data(), 1, 2, 0.5f};
    CHECK_THROWS_WITH(cpu::attention(out.data(), qkv.data(), kc.data(), vc.data(), &pos, &seq, 1, a, pool),
                      doctest::Contains("outside the block tables"));
    pos = 3;
    tables[1] = 2;  // the cache has blocks 0 and 1
    CHECK_THROWS_WITH(cpu::attention(out.data(), qkv.data(), kc.data(), vc.data(), &pos, &seq, 1, a, pool),
                      doctest::Contains("reads block 2"));
    tables[1] = -1;  // no block where the token's position lies
    CHECK_THROWS_WITH(cpu::attention(out.data(), qkv.data(), kc.data(), vc.data(), &pos, &seq, 1, a, pool),
                      doctest::Contains("reads block -1"));
    seq = 1;  // no such sequence
    CHECK_THROWS_WITH(cpu::attention(out.data(), qkv.data(), kc.data(), vc.data(), &pos, &seq, 1, a, pool),
                      doctest::Contains("outside the block tables"));
}

TEST_CASE("silu_mul and embed with a vocab-parallel offset") {
    std::mt19937 rng(4);
    ThreadPool pool(2, false);
    // f = 13: the scalar tail only; 45: two 16-lane vectors and a tail, gates out to +-30 and beyond
    // (e^-|g| below float's normal range: the gate's sign decides)
    for (const int64_t f : {int64_t(13), int64_t(45)}) {
        const int64_t m = 3;
        auto gu = rand_vec(size_t(m * 2 * f), rng, f == 13 ? -4.0f : -30.0f, f == 13 ? 4.0f : 30.0f);
        if (f == 45) gu[0] = -100.0f, gu[1] = 100.0f, gu[2] = 0.0f, gu[3] = -1e-30f;
        std::vector<float> out(size_t(m * f), std::nanf(""));
        cpu::silu_mul(out.data(), gu.data(), m, f, pool);
        for (int64_t r = 0; r < m; ++r)
            for (int64_t i = 0; i < f; ++i) {
                const double g = gu[size_t(r * 2 * f + i)], u = gu[size_t(r * 2 * f + f + i)];
                const double want = g / (1 + std::exp(-g)) * u;
                CHECK_MESSAGE(std::fabs(out[size_t(r * f + i)] - want) <= 1e-6 * std::fabs(want) + 1e-30,
                              "f ", f, " row ", r, " col ", i, ": ", out[size_t(r * f + i)], " vs ", want);
            }
    }
    // Table rows 10..14 of a 20-row vocab (this rank's shard), bf16.
    const int64_t n = 6;
    std::vector<uint16_t> table(size_t(5 * n));
    for (size_t i = 0; i < table.size(); ++i) table[i] = f32_to_bf16(float(i) * 0.25f);
    std::vector<int32_t> ids = {9, 10, 14, 15};
    std::vector<float> e(size_t(4 * n), std::nanf(""));
    cpu::embed(e.data(), table.data(), DType::kBF16, 5, n, ids.data(), 4, 10);
    for (int64_t j = 0; j < n; ++j) {
        CHECK(e[size_t(j)] == 0.0f);                       // id 9: another rank's row
        CHECK(e[size_t(n + j)] == float(j) * 0.25f);       // id 10: local row 0
        CHECK(e[size_t(2 * n + j)] == float(4 * n + j) * 0.25f);  // id 14: local row 4
        CHECK(e[size_t(3 * n + j)] == 0.0f);               // id 15: beyond the shard
    }
}

TEST_CASE("select_token: greedy with bans, top-k / top-p / min-p kept sets, frequencies, raw log-probabilities") {
    // logits chosen so the probabilities are easy to name: exp(0), exp(-1), exp(-1), exp(-2), exp(-5), exp(-9)
    const std::vector<float> base = {0.0f, -1.0f, -1.0f, -2.0f, -5.0f, -9.0f};
    const int64_t V = int64_t(base.size());
    double z = 0;
    for (float v : base) z += std::exp(double(v));
    auto pick = [&](float t, int64_t k, float top_p, float min_p, float u, std::vector<int32_t> bans = {}) {
        std::vector<float> row = base;
        float lp = 0;
        const int32_t id = lattice::cpu::select_token(row.data(), V, t, k, top_p, min_p, u, bans.data(),
                                                      int64_t(bans.size()), &lp);
        CHECK(lp == doctest::Approx(double(base[size_t(id)]) - std::log(z)).epsilon(1e-5));  // raw row
        return id;
    };
    CHECK(pick(0.0f, 0, 1.0f, 0.0f, 0.0f) == 0);
    CHECK(pick(0.0f, 0, 1.0f, 0.0f, 0.0f, {0, -3, 99}) == 1);  // the ban moves greedy to the next (lowest id of a tie)
    // Over a grid of draws u, the pick frequencies equal the kept set's renormalized probabilities.
    auto freqs = [&](float t, int64_t k, float top_p, float min_p, std::vector<int32_t> bans = {}) {
        std::vector<double> f(size_t(V), 0.0);
        const int n = 20000;
        for (int i = 0; i < n; ++i) f[size_t(pick(t, k, top_p, min_p, (float(i) + 0.5f) / float(n), bans))] += 1.0 / n;
        return f;
    };
    auto expect = [&](std::vector<int> kept, float t) {
        std::vector<double> w(size_t(V), 0.0);
        double s = 0;
        for (int j : kept) s += (w[size_t(j)] = std::exp(double(base[size_t(j)]) / double(t)));
        for (double& e : w) e /= s;
        return w;
    };
    auto near = [](const std::vector<double>& a, const std::vector<double>& b) {
        for (size_t j = 0; j < a.size(); ++j)
            if (std::abs(a[j] - b[j]) > 2e-4) return false;
        return true;
    };
    CHECK(near(freqs(1.0f, 0, 1.0f, 0.0f), expect({0, 1, 2, 3, 4, 5}, 1.0f)));
    CHECK(near(freqs(0.5f, 0, 1.0f, 0.0f), expect({0, 1, 2, 3, 4, 5}, 0.5f)));
    CHECK(near(freqs(1.0f, 2, 1.0f, 0.0f), expect({0, 1, 2}, 1.0f)));          // top-k 2: the tie with the 2nd is kept
    CHECK(near(freqs(1.0f, 0, 0.5f, 0.0f), expect({0}, 1.0f)));        // p(0) = 0.53 >= 0.5: the top alone
    CHECK(near(freqs(1.0f, 0, 0.6f, 0.0f), expect({0, 1, 2}, 1.0f)));  // 0.53 + 0.2 reaches 0.6: the tie kept too
    CHECK(near(freqs(1.0f, 0, 1.0f, 0.3f), expect({0, 1, 2}, 1.0f)));          // exp(-1) = 0.37 >= 0.3, exp(-2) not
    CHECK(near(freqs(1.0f, 0, 1.0f, 0.0f, {0, 1}), expect({2, 3, 4, 5}, 1.0f)));  // bans leave the set
}

TEST_CASE("argmax: the lowest index of the largest entry across lanes and tail, NaN never, 0 without any") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t n : {int64_t(1), int64_t(5), int64_t(16), int64_t(37), int64_t(49152), int64_t(49159)}) {
        std::vector<float> x(size_t(n), -1.0f);
        CHECK(cpu::argmax(x.data(), n) == 0);  // all equal: the first
        x[size_t(n - 1)] = 3.0f;
        CHECK(cpu::argmax(x.data(), n) == n - 1);  // the last (a tail entry when n % 16 != 0)
        if (n < 37) continue;
        x[20] = 3.0f;  // tie in another lane, lower index
        CHECK(cpu::argmax(x.data(), n) == 20);
        x[4] = 3.0f;  // a lower lane of an earlier vector
        CHECK(cpu::argmax(x.data(), n) == 4);
        x[36] = 3.0f;  // same lane as 20 and 4's vector neighbour, higher index: no change
        CHECK(cpu::argmax(x.data(), n) == 4);
        x[0] = nan;
        x[n / 2] = nan;
        CHECK(cpu::argmax(x.data(), n) == 4);  // NaN never wins, even at index 0
        x[size_t(n / 3)] = 3.5f;
        CHECK(cpu::argmax(x.data(), n) == n / 3);
    }
    std::vector<float> none(40, -INFINITY);
    none[9] = nan;
    CHECK(cpu::argmax(none.data(), 40) == 0);
    std::vector<float> inf_last(33, 0.0f);
    inf_last[32] = INFINITY;
    CHECK(cpu::argmax(inf_last.data(), 33) == 32);
}

TEST_CASE("log_sum_exp equals the double-precision log-sum-exp at odd lengths, with NaN and -inf entries") {
    std::mt19937 g(2024);
    std::normal_distribution<float> d(0.0f, 4.0f);
    for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(1000), int64_t(32000), int64_t(128257)}) {
        std::vector<float> x(static_cast<size_t>(n));
        for (float& v : x) v = d(g) + 10.0f;  // logits around 10, a few far out
        x[size_t(n / 2)] = 40.0f;
        if (n > 20) {
            x[3] = -INFINITY;  // a banned id
            x[7] = std::numeric_limits<float>::quiet_NaN();  // counts as -inf
        }
        double mx = -INFINITY;
        for (float v : x)
            if (v == v) mx = std::max(mx, double(v));
        double z = 0;
        for (float v : x)
            if (v == v) z += std::exp(double(v) - mx);
        const double want = mx + std::log(z);
        const double got = cpu::log_sum_exp(x.data(), n);
        CHECK_MESSAGE(std::fabs(got - want) < 1e-5 * std::fabs(want), "n ", n, ": ", got, " vs ", want);
    }
    // equal logits: log n, the float partial sums exact
    std::vector<float> flat(128257, 2.0f);
    CHECK(cpu::log_sum_exp(flat.data(), 128257) == doctest::Approx(2.0 + std::log(128257.0)).epsilon(1e-9));
    std::vector<float> all_inf(33, -INFINITY);
    CHECK(cpu::log_sum_exp(all_inf.data(), 33) == -INFINITY);
    std::vector<float> one{-3.5f};
    CHECK(cpu::log_sum_exp(one.data(), 1) == doctest::Approx(-3.5).epsilon(1e-7));
}
