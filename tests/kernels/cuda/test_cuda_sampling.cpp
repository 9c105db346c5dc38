// CUDA token selection against CPU references: argmax (ties, NaN) and sampling (temperature,
// top-k, top-p, inverse CDF) against a serial reference of the same algorithm.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "tests/kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/kernels.h"

using namespace lattice;
using namespace lattice::test;

TEST_CASE("cuda argmax: lowest index on ties, NaN ignored" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const int64_t m = 3, v = 1001;
    std::vector<float> logits = random_vec(rng, size_t(m * v), -10, 10);
    logits[17] = 50.0f;
    logits[900] = 50.0f;       // tie in row 0: 17 wins
    logits[v + 3] = NAN;       // row 1: NaN must not win
    logits[v + 1000] = 40.0f;  // row 1: last element
    logits[2 * v + 0] = 60.0f;
    DevBuf dl(logits), dout(size_t(m) * 4);
    cuda::argmax(dout.get<int32_t>(), dl.get(), DType::kF32, m, v, nullptr);
    CHECK(dout.download<int32_t>(size_t(m)) == std::vector<int32_t>{17, 1000, 0});
}

namespace {

// Serial reference of the device sampling algorithm; returns -1 when u lies within `eps` of a CDF
// boundary (summation order could legitimately flip the pick there). eps = 1e-4 of the total: the device
// sums exp() in fp32 (expf <= 2 ulp) in its own order; for v <= 3001 positive terms the cumulative sums
// differ from these double ones by ~2^-24 sqrt(v) = 3e-6 of the total (rounding errors of random
// direction), 30x under eps; even all 3001 errors aligned (1.8e-4) would flip a pick only for u within
// 1.8e-4 of a boundary, a chance of ~4e-4 per row.
int32_t sample_ref(const float* logits, int64_t v, const cuda::SampleParams& p, double eps) {
    std::vector<float> x(static_cast<size_t>(v));
    float mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, x[size_t(j)] = logits[j] / p.temperature);
    float kth = -INFINITY;
    if (p.top_k > 0 && p.top_k < v) {
        std::vector<float> s = x;
        std::nth_element(s.begin(), s.begin() + (p.top_k - 1), s.end(), std::greater<float>());
        kth = s[size_t(p.top_k - 1)];
    }
    std::vector<double> w(size_t(v), 0.0);
    for (int64_t j = 0; j < v; ++j)
        if (x[size_t(j)] >= kth) w[size_t(j)] = std::exp(double(x[size_t(j)]) - mx);
    double z = std::accumulate(w.begin(), w.end(), 0.0);
    if (p.top_p < 1.0f) {
        std::vector<double> s = w;
        std::sort(s.begin(), s.end(), std::greater<double>());
        double cum = 0, thr = 0;
        for (double e : s) {
            cum += e;
            thr = e;
            if (cum >= p.top_p * z) break;
        }
        for (auto& e : w)
            if (e < thr) e = 0;
    }
    const double total = std::accumulate(w.begin(), w.end(), 0.0), target = double(p.u) * total;
    double cum = 0;
    for (int64_t j = 0; j < v; ++j) {
        if (w[size_t(j)] == 0) continue;
        if (std::abs(cum - target) < eps * total && cum > 0) return -1;
        cum += w[size_t(j)];
        if (cum > target) return std::abs(cum - target) < eps * total ? -1 : int32_t(j);
    }
    return -1;
}

}  // namespace

TEST_CASE("cuda sampling: temperature, top-k, top-p, inverse CDF" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const int64_t v = 3001;
    const std::vector<cuda::SampleParams> kinds = {
        {1.0f, 0, 1.0f, 0}, {0.7f, 5, 1.0f, 0}, {1.3f, 0, 0.9f, 0}, {1.0f, 50, 0.5f, 0}, {1.0f, 1, 1.0f, 0}};
    int compared = 0;
    for (int rep = 0; rep < 20; ++rep) {
        const int64_t m = int64_t(kinds.size());
        std::vector<float> logits = random_vec(rng, size_t(m * v), -4, 4);
        std::vector<cuda::SampleParams> params = kinds;
        std::uniform_real_distribution<float> U(0.0f, 1.0f);
        for (auto& p : params) p.u = std::min(U(rng), 0.999f);
        DevBuf dl(logits), dp(params), dout(size_t(m) * 4);
        cuda::sample(dout.get<int32_t>(), dl.get(), DType::kF32, m, v, dp.get<cuda::SampleParams>(), nullptr);
        std::vector<int32_t> got = dout.download<int32_t>(size_t(m));
        for (int64_t i = 0; i < m; ++i) {
            const int32_t ref = sample_ref(&logits[size_t(i * v)], v, params[size_t(i)], 1e-4);
            INFO("row " << i << " u " << params[size_t(i)].u);
            REQUIRE(got[size_t(i)] >= 0);
            REQUIRE(got[size_t(i)] < v);
            if (ref >= 0) {
                CHECK(got[size_t(i)] == ref);
                ++compared;
            }
        }
        // top_k = 1 is greedy.
        CHECK(got[4] ==
              int32_t(std::max_element(logits.begin() + 4 * v, logits.begin() + 5 * v) - (logits.begin() + 4 * v)));
    }
    CHECK(compared > 80);  // boundary skips are rare
}

TEST_CASE("cuda select_tokens: greedy and sampled rows, bans, min_p, raw log-probabilities" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const int64_t v = 2003, m = 5;
    std::vector<float> logits = random_vec(rng, size_t(m * v), -4, 4);
    auto row = [&](int64_t i) { return logits.begin() + i * v; };
    auto argmax_of = [&](int64_t i) { return int32_t(std::max_element(row(i), row(i) + v) - row(i)); };
    const int32_t top0 = argmax_of(0), top2 = argmax_of(2);
    // row 0: greedy with its argmax banned -> the runner-up; row 1: greedy; row 2: min_p = 1 keeps only
    // the argmax; row 3: top_k = 1; row 4: plain sampling, compared with the serial reference.
    std::vector<int32_t> bans = {top0, -5, int32_t(v + 3)};  // out-of-range bans are ignored
    std::uniform_real_distribution<float> U(0.0f, 0.999f);
    const float u4 = U(rng);
    const std::vector<cuda::SelectParams> params = {{0.0f, 0, 1.0f, 0.0f, 0.0f, 0, 3},
                                                    {0.0f, 0, 1.0f, 0.0f, 0.0f, 3, 3},
                                                    {0.8f, 0, 1.0f, 1.0f, U(rng), 3, 3},
                                                    {1.2f, 1, 1.0f, 0.0f, U(rng), 3, 3},
                                                    {1.0f, 0, 1.0f, 0.0f, u4, 3, 3}};
    const std::vector<float> raw = logits;
    DevBuf dl(logits), dp(params), db(bans), dids(size_t(m) * 4), dlp(size_t(m) * 4);
    cuda::select_tokens(dids.get<int32_t>(), dlp.get<float>(), dl.get<float>(), m, v, dp.get<cuda::SelectParams>(),
                        db.get<int32_t>(), nullptr, nullptr);
    const std::vector<int32_t> ids = dids.download<int32_t>(size_t(m));
    const std::vector<float> lps = dlp.download<float>(size_t(m));
    std::vector<float> banned0(raw.begin(), raw.begin() + v);
    banned0[size_t(top0)] = -INFINITY;
    CHECK(ids[0] == int32_t(std::max_element(banned0.begin(), banned0.end()) - banned0.begin()));
    CHECK(ids[1] == argmax_of(1));
    CHECK(ids[2] == top2);
    CHECK(ids[3] == argmax_of(3));
    const cuda::SampleParams p4{1.0f, 0, 1.0f, u4};
    const int32_t ref4 = sample_ref(&raw[size_t(4 * v)], v, p4, 1e-4);
    if (ref4 >= 0) CHECK(ids[4] == ref4);
    for (int64_t i = 0; i < m; ++i) {
        INFO("row " << i);
        REQUIRE(ids[size_t(i)] >= 0);
        REQUIRE(ids[size_t(i)] < v);
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < v; ++j) mx = std::max(mx, double(raw[size_t(i * v + j)]));
        for (int64_t j = 0; j < v; ++j) z += std::exp(double(raw[size_t(i * v + j)]) - mx);
        const double want = double(raw[size_t(i * v + ids[size_t(i)])]) - (mx + std::log(z));
        // log p = x - (max + log z): x and max are exact; z is an fp32 sum of expf over v = 2003 terms, off by
        // ~2^-24 sqrt(v) = 3e-6 relative (<= 1.2e-4 with every error aligned), so log z by as much in
        // absolute terms; doctest's Approx allows 1e-4 x (1 + |log p|) >= 1e-4: 30x the typical error.
        CHECK(lps[size_t(i)] == doctest::Approx(want).epsilon(1e-4));
    }
}

// Penalties on the device: per-id edits (repetition: divide a positive logit / multiply a negative
// one; presence + frequency: subtract) before the bans and the pick, as the host sampler applies
// them; the pick's log-probability stays that of the raw row. Greedy rows, so the pick is exact:
// row 0: its argmax repetition-penalized (x 1/8) loses to the runner-up; row 1: the argmax gets a
// subtraction that sinks it, the runner-up is repetition-penalized too; row 2: edits on ids that
// stay below the argmax change nothing; row 3: a negative logit penalized both ways (x rp, then
// minus sub), and an edit on a banned id stays banned.
TEST_CASE("cuda select_tokens: penalty edits before the pick, the raw row's log-probability" *
          doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    const int64_t v = 1001, m = 4;
    std::vector<float> logits = random_vec(rng, size_t(m * v), -2, 2);
    auto at = [&](int64_t i, int64_t j) -> float& { return logits[size_t(i * v + j)]; };
    at(0, 10) = 6.0f, at(0, 11) = 5.0f;   // 6 / 8 = 0.75 < 5: id 11 wins
    at(1, 20) = 6.0f, at(1, 21) = 5.5f, at(1, 22) = 5.0f;  // 20 - 3 = 3; 21 / 2 = 2.75: id 22 wins
    at(2, 30) = 7.0f;                      // stays the argmax
    at(3, 40) = 9.0f, at(3, 41) = 8.0f;   // 40 banned (and edited); 41 - 0.5 = 7.5 still above 4
    const std::vector<cuda::PenaltyEdit> edits = {
        {10, 1, 0.0f, 0.0f},                        // row 0
        {20, 0, 3.0f, 0.0f},  {21, 1, 0.0f, 0.0f},  // row 1
        {5, 1, 0.5f, 0.0f},   {6, 0, 1.0f, 0.0f},   // row 2
        {40, 1, 2.0f, 0.0f},  {41, 0, 0.5f, 0.0f},  // row 3
    };
    const std::vector<int32_t> bans = {40};
    std::vector<cuda::SelectParams> params(static_cast<size_t>(m));
    const int32_t pen[][2] = {{0, 1}, {1, 3}, {3, 5}, {5, 7}};
    const float rp[] = {8.0f, 2.0f, 1.3f, 1.5f};
    for (int64_t i = 0; i < m; ++i) {
        params[size_t(i)] = {0.0f, 0, 1.0f, 0.0f, 0.0f, i == 3 ? 0 : 1, 1};  // only row 3 has the ban
        params[size_t(i)].repeat_penalty = rp[i];
        params[size_t(i)].pen_begin = pen[i][0];
        params[size_t(i)].pen_end = pen[i][1];
    }
    const std::vector<float> raw = logits;
    DevBuf dl(logits), dp(params), db(bans), de(edits), dids(size_t(m) * 4), dlp(size_t(m) * 4);
    cuda::select_tokens(dids.get<int32_t>(), dlp.get<float>(), dl.get<float>(), m, v, dp.get<cuda::SelectParams>(),
                        db.get<int32_t>(), de.get<cuda::PenaltyEdit>(), nullptr);
    const std::vector<int32_t> ids = dids.download<int32_t>(size_t(m));
    const std::vector<float> lps = dlp.download<float>(size_t(m));
    // The host's penalized rows (Sampler::penalize's formula) and their argmax.
    std::vector<float> host = raw;
    for (int64_t i = 0; i < m; ++i)
        for (int32_t e = pen[i][0]; e < pen[i][1]; ++e) {
            float& l = host[size_t(i * v + edits[size_t(e)].id)];
            if (edits[size_t(e)].repeat) l = l > 0 ? l / rp[i] : l * rp[i];
            l -= edits[size_t(e)].sub;
        }
    host[size_t(3 * v + 40)] = -INFINITY;
    CHECK(ids[0] == 11);
    CHECK(ids[1] == 22);
    CHECK(ids[2] == 30);
    CHECK(ids[3] == 41);
    const std::vector<float> edited = dl.download<float>(size_t(m * v));
    CHECK(edited == host);  // the row as the host would have sampled from it
    for (int64_t i = 0; i < m; ++i) {
        INFO("row " << i);
        CHECK(ids[size_t(i)] == int32_t(std::max_element(host.begin() + i * v, host.begin() + (i + 1) * v) -
                                        (host.begin() + i * v)));
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < v; ++j) mx = std::max(mx, double(raw[size_t(i * v + j)]));
        for (int64_t j = 0; j < v; ++j) z += std::exp(double(raw[size_t(i * v + j)]) - mx);
        // The raw log-probability within 1e-4 x (1 + |log p|), as in the case above (v = 1001 here).
        CHECK(lps[size_t(i)] ==
              doctest::Approx(double(raw[size_t(i * v + ids[size_t(i)])]) - (mx + std::log(z))).epsilon(1e-4));
    }
    // The raw logits of the edited ids came back in the edits.
    const std::vector<cuda::PenaltyEdit> back = de.download<cuda::PenaltyEdit>(edits.size());
    for (int64_t i = 0; i < m; ++i)
        for (int32_t e = pen[i][0]; e < pen[i][1]; ++e)
            CHECK(back[size_t(e)].raw == raw[size_t(i * v + edits[size_t(e)].id)]);
}
