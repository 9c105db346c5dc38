// 4-bit GEMM tests (kernels/cpu/int4_gemm.h): packing keeps every dequantized value bit for bit; W4A8 on every
// ISA path equals the scalar path bit for bit and a double-precision evaluation of the same sum within the
// rounding bound of its float epilogue; W4A16 on every path (decode and prefill tiles) is within its
// rounding bound of the double sum; for each kind (offset8, zero-point, affine), group 32 / 64 / 128, m = 1
// and tails of m, n off the 16-channel panels and k off the group; outputs poisoned with guard cells; 1 vs 3
// threads bit-identical; the float -> 4-bit quantizer's round-trip bound; bad input refused.
//
// Bounds (u = 2^-24, first order): W4A8 performs per group one or two fmas into acc, each of a product of two
// scales rounded once, so |y - Y| <= (2 groups + 2) u sum_g s_g (|d_g I'_g| + |m_g X_g|) with the exact
// integers I', X of the group-quantized activations.
// W4A16 sums k products per group (or k products of rounded dequantized weights in the prefill tile), plus
// 2 ops per group and the group sums of x: |y - Y| <= (k + 2 groups + 4) u sum_k |x_k| (|d (q - z)| + |m|).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/common/quantize.h"
#include "kernels/cpu/int4_gemm.h"
#include "tests/kernels/common/int4_test_util.h"
#include "tests/kernels/cpu/int8_test_util.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_int4_gemm {

using namespace lattice;
using namespace lattice::test;

namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr int64_t kGuard = 37;
constexpr Int4Kind kKinds[] = {Int4Kind::kOffset8, Int4Kind::kZeroPoint, Int4Kind::kAffine};

int32_t nibble(const Int4Weights& w, int64_t r, int64_t c) {
    return w.nibble(r, c);
}

struct Ref {
    std::vector<double> y;      // [m, n]
    std::vector<double> bound;  // [m, n]
};

// Activations quantized as gemm_w4a8 does: each group of `group` columns of each row on its own.
struct GroupActs {
    std::vector<int8_t> q;  // [m, k]
    std::vector<float> s;   // [m, groups]
};
GroupActs quantize_groups(const std::vector<float>& x, int64_t m, int64_t k, int64_t group) {
    const int64_t groups = (k + group - 1) / group;
    GroupActs a{std::vector<int8_t>(size_t(m * k)), std::vector<float>(size_t(m * groups))};
    for (int64_t r = 0; r < m; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t c0 = g * group, len = std::min(k, c0 + group) - c0;
            a.s[size_t(r * groups + g)] = quantize_row_int8(x.data() + r * k + c0, len, a.q.data() + r * k + c0);
        }
    return a;
}

// W4A8 in double from the unpacked weights and the quantized rows (independent of the packed layout).
Ref ref_w4a8(const Int4Weights& w, const GroupActs& a, int64_t m) {
    const Int4Matrix mat = w.matrix();
    const int64_t groups = mat.groups();
    Ref out{std::vector<double>(size_t(m * w.n)), std::vector<double>(size_t(m * w.n))};
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < w.n; ++c) {
            double y = 0, mag = 0;
            for (int64_t g = 0; g < groups; ++g) {
                int64_t I = 0, X = 0;
                for (int64_t i = g * w.group; i < std::min(w.k, (g + 1) * w.group); ++i) {
                    I += int64_t(nibble(w, c, i)) * a.q[size_t(r * w.k + i)];
                    X += a.q[size_t(r * w.k + i)];
                }
                const size_t gi = size_t(c * groups + g);
                const double d = f16_to_f32(w.d[gi]), sg = a.s[size_t(r * groups + g)];
                double t1 = 0, t2 = 0;
                if (w.kind == Int4Kind::kOffset8) t1 = d * sg * double(I - 8 * X);
                if (w.kind == Int4Kind::kZeroPoint) t1 = d * sg * double(I - int64_t(w.z[gi]) * X);
                if (w.kind == Int4Kind::kAffine) {
                    t1 = d * sg * double(I);
                    t2 = double(f16_to_f32(w.m[gi])) * sg * double(X);
                }
                y += t1 + t2;
                mag += std::fabs(t1) + std::fabs(t2);
            }
            out.y[size_t(r * w.n + c)] = y;
            out.bound[size_t(r * w.n + c)] = 1.01 * double(2 * groups + 2) * kU * mag + 1e-30;
        }
    return out;
}

// W4A16 in double from the unpacked weights and the f32 rows.
Ref ref_w4a16(const Int4Weights& w, const std::vector<float>& x, int64_t m) {
    const Int4Matrix mat = w.matrix();
    const int64_t groups = mat.groups();
    Ref out{std::vector<double>(size_t(m * w.n)), std::vector<double>(size_t(m * w.n))};
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < w.n; ++c) {
            double y = 0, mag = 0;
            for (int64_t i = 0; i < w.k; ++i) {
                const size_t gi = size_t(c * groups + i / w.group);
                const double d = f16_to_f32(w.d[gi]), q = nibble(w, c, i);
                const double z = w.kind == Int4Kind::kOffset8 ? 8 : w.kind == Int4Kind::kZeroPoint ? w.z[gi] : 0;
                const double mn = w.kind == Int4Kind::kAffine ? f16_to_f32(w.m[gi]) : 0;
                const double xv = x[size_t(r * w.k + i)];
                y += xv * (d * (q - z) + mn);
                mag += std::fabs(xv) * (std::fabs(d * (q - z)) + std::fabs(mn));
            }
            out.y[size_t(r * w.n + c)] = y;
            out.bound[size_t(r * w.n + c)] = 1.01 * double(w.k + 2 * groups + 4) * kU * mag + 1e-30;
        }
    return out;
}

// Runs fn(y) into a NaN-poisoned buffer with guard cells; checks the guard and that every output was written.
template <class Fn>
std::vector<float> run_poisoned(int64_t m, int64_t n, Fn&& fn) {
    const float poison = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> y(size_t(m * n + kGuard), poison);
    fn(y.data());
    for (int64_t i = m * n; i < m * n + kGuard; ++i) REQUIRE(std::isnan(y[size_t(i)]));
    y.resize(size_t(m * n));
    for (size_t i = 0; i < y.size(); ++i) REQUIRE(std::isfinite(y[i]));
    return y;
}

void check_within(const std::vector<float>& y, const Ref& ref, const char* what) {
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < y.size(); ++i)
        if (!(std::fabs(double(y[i]) - ref.y[i]) <= ref.bound[i])) {
            if (first < 0) first = int64_t(i);
            ++bad;
        }
    INFO(what, ": first out of bound at ", first,
         first >= 0 ? " got " + std::to_string(y[size_t(first)]) + " want " + std::to_string(ref.y[size_t(first)]) +
                          " +- " + std::to_string(ref.bound[size_t(first)])
                    : std::string());
    REQUIRE(bad == 0);
}

}  // namespace

TEST_CASE("int4: packing keeps every dequantized value, for each kind and group") {
    std::mt19937 rng(7);
    for (Int4Kind kind : kKinds)
        for (int64_t group : {32, 64, 128})
            for (int64_t n : {1, 16, 17, 40})
                for (int64_t k : {32, 40, 128, 200}) {
                    CAPTURE(int4_kind_name(kind));
                    CAPTURE(group);
                    CAPTURE(n);
                    CAPTURE(k);
                    Int4Weights w = random_int4(n, k, group, kind, rng);
                    const Int4Matrix mat = w.matrix();
                    PackedInt4 p = pack_int4_weights(mat, IsaLevel::kScalar);
                    CHECK(p.k_padded % group == 0);
                    CHECK(p.bytes() == p.n_panels * p.groups * p.block_bytes);
                    std::vector<float> out(size_t(n * k));
                    dequantize_packed_int4(p, out.data());
                    int64_t bad = 0;
                    for (int64_t r = 0; r < n; ++r)
                        for (int64_t c = 0; c < k; ++c) {
                            const float want = int4_value(mat, r, c);  // no permutation: stored = channel order
                            bad += std::memcmp(&want, &out[size_t(r * k + c)], 4) != 0;
                        }
                    REQUIRE(bad == 0);
                }
}

TEST_CASE("int4: dequantized values follow each kind's formula") {
    Int4Weights w(1, 32, 32, Int4Kind::kOffset8);
    w.qs[0] = 0x3C;  // element 0: q = 12, element 16: q = 3
    w.d[0] = f32_to_f16(0.5f);
    CHECK(int4_value(w.matrix(), 0, 0) == 2.0f);
    CHECK(int4_value(w.matrix(), 0, 16) == -2.5f);
    Int4Weights a(1, 32, 32, Int4Kind::kAffine);
    a.qs[1] = 0x0F;  // element 1: q = 15
    a.d[0] = f32_to_f16(0.25f);
    a.m[0] = f32_to_f16(-1.0f);
    CHECK(int4_value(a.matrix(), 0, 1) == 2.75f);
    CHECK(int4_value(a.matrix(), 0, 17) == -1.0f);
    Int4Weights z(1, 64, 64, Int4Kind::kZeroPoint);
    z.qs[0] = 0x05;
    z.d[0] = f32_to_f16(2.0f);
    z.z[0] = 7;
    CHECK(int4_value(z.matrix(), 0, 0) == -4.0f);
    CHECK(int4_value(z.matrix(), 0, 16) == -14.0f);
}

TEST_CASE("w4a8: every ISA path equals the scalar path bit for bit, within the bound of the double sum") {
    ThreadPool pool(1);  // thread counts: the prefill case below
    std::mt19937 rng(1234);
    for (Int4Kind kind : kKinds)
        for (int64_t group : {32, 64, 128})
            for (int64_t n : {1, 17, 40, 70})  // 70: 5 panels, several chunks of the 3-thread pool
                for (int64_t k : {32, 40, 256}) {
                    CAPTURE(int4_kind_name(kind));
                    CAPTURE(group);
                    CAPTURE(n);
                    CAPTURE(k);
                    Int4Weights w = random_int4(n, k, group, kind, rng);
                    const int64_t mmax = 9;
                    std::vector<float> x = random_f32(size_t(mmax * k), rng);
                    x[0] = 50.0f;  // an outlier: the largest activation of its group quantizes to 127
                    const GroupActs acts = quantize_groups(x, mmax, k, group);
                    REQUIRE(any_nonzero(acts.q));
                    for (int64_t m : {1, 2, 3, 5, 9}) {
                        CAPTURE(m);
                        const Ref ref = ref_w4a8(w, acts, m);
                        std::vector<float> base;
                        for (IsaLevel isa : supported_isas()) {
                            CAPTURE(isa_name(isa));
                            PackedInt4 p = pack_int4_weights(w.matrix(), isa);
                            std::vector<float> y =
                                run_poisoned(m, n, [&](float* out) { gemm_w4a8(x.data(), m, k, p, out, pool); });
                            if (isa == IsaLevel::kScalar) {
                                check_within(y, ref, "scalar w4a8");
                                base = y;
                            } else {
                                REQUIRE(std::memcmp(y.data(), base.data(), y.size() * 4) == 0);
                            }
                        }
                    }
                }
}

TEST_CASE("w4a8: prefill sizes (m = 17, 33) on 1 and 3 threads give the same bits") {
    ThreadPool pool(3), one(1);
    std::mt19937 rng(99);
    const int64_t n = 70, k = 192, m = 33;
    for (Int4Kind kind : kKinds) {
        CAPTURE(int4_kind_name(kind));
        Int4Weights w = random_int4(n, k, 64, kind, rng);
        std::vector<float> x = random_f32(size_t(m * k), rng);
        const Ref ref = ref_w4a8(w, quantize_groups(x, m, k, 64), m);
        std::vector<float> base;
        for (IsaLevel isa : supported_isas()) {
            CAPTURE(isa_name(isa));
            PackedInt4 p = pack_int4_weights(w.matrix(), isa);
            for (int64_t mm : {int64_t(17), m}) {
                std::vector<float> y =
                    run_poisoned(mm, n, [&](float* out) { gemm_w4a8(x.data(), mm, k, p, out, pool); });
                std::vector<float> y1 =
                    run_poisoned(mm, n, [&](float* out) { gemm_w4a8(x.data(), mm, k, p, out, one); });
                REQUIRE(std::memcmp(y.data(), y1.data(), y.size() * 4) == 0);
                if (mm == m) {
                    check_within(y, ref, "w4a8 prefill");
                    if (base.empty()) base = y;
                    REQUIRE(std::memcmp(y.data(), base.data(), y.size() * 4) == 0);
                }
            }
        }
    }
}

TEST_CASE("w4a16: every ISA path (decode and prefill tiles) within the bound of the double sum") {
    ThreadPool pool(1);
    std::mt19937 rng(4321);
    for (Int4Kind kind : kKinds)
        for (int64_t group : {32, 128})
            for (int64_t n : {1, 17, 40})
                for (int64_t k : {40, 256}) {
                    CAPTURE(int4_kind_name(kind));
                    CAPTURE(group);
                    CAPTURE(n);
                    CAPTURE(k);
                    Int4Weights w = random_int4(n, k, group, kind, rng);
                    const int64_t mmax = 20;
                    std::vector<float> x = random_f32(size_t(mmax * k), rng);
                    for (int64_t m : {1, 3, 5, 20}) {
                        CAPTURE(m);
                        const Ref ref = ref_w4a16(w, x, m);
                        for (IsaLevel isa : supported_isas()) {
                            CAPTURE(isa_name(isa));
                            PackedInt4 p = pack_int4_weights(w.matrix(), isa);
                            std::vector<float> y =
                                run_poisoned(m, n, [&](float* out) { gemm_w4a16(x.data(), m, k, p, out, pool); });
                            check_within(y, ref, "w4a16");
                        }
                    }
                }
}

TEST_CASE("w4a16: results do not depend on the thread count") {
    ThreadPool three(3), one(1);
    std::mt19937 rng(5);
    const int64_t n = 100, k = 256;
    Int4Weights w = random_int4(n, k, 32, Int4Kind::kAffine, rng);
    std::vector<float> x = random_f32(size_t(24 * k), rng);
    for (IsaLevel isa : supported_isas())
        for (int64_t m : {1, 4, 24}) {
            PackedInt4 p = pack_int4_weights(w.matrix(), isa);
            std::vector<float> a = run_poisoned(m, n, [&](float* out) { gemm_w4a16(x.data(), m, k, p, out, three); });
            std::vector<float> b = run_poisoned(m, n, [&](float* out) { gemm_w4a16(x.data(), m, k, p, out, one); });
            CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
        }
}

TEST_CASE("quantize_weights_int4: round trip within half a step, ties of the range kept, bad input refused") {
    std::mt19937 rng(11);
    const int64_t n = 5, k = 75;  // the last group is partial
    std::vector<float> wf = random_f32(size_t(n * k), rng, 0.05f);
    wf[3] = 0.4f;  // an outlier widens its group's step
    for (int64_t group : {32, 64}) {
        Int4Weights q = quantize_weights_int4(wf.data(), n, k, group);
        const Int4Matrix mat = q.matrix();
        const int64_t groups = mat.groups();
        for (int64_t r = 0; r < n; ++r)
            for (int64_t c = 0; c < k; ++c) {
                const size_t gi = size_t(r * groups + c / group);
                float mn = 1e30f, mx = -1e30f;
                for (int64_t i = c / group * group; i < std::min(k, (c / group + 1) * group); ++i) {
                    mn = std::min(mn, wf[size_t(r * k + i)]);
                    mx = std::max(mx, wf[size_t(r * k + i)]);
                }
                const double d = f16_to_f32(q.d[gi]), m = f16_to_f32(q.m[gi]);
                // Half a step, plus what rounding the step and the minimum to f16 can move the ends.
                const double bound = 0.5 * d + std::fabs(m - mn) + 15 * std::fabs(d - (mx - mn) / 15.0) + 1e-7;
                INFO("r=", r, " c=", c);
                REQUIRE(std::fabs(int4_value(mat, r, c) - wf[size_t(r * k + c)]) <= bound);
            }
    }
    std::vector<float> flat(64, 0.25f);  // a constant group: step 0, every value is the minimum
    Int4Weights c = quantize_weights_int4(flat.data(), 1, 64, 32);
    CHECK(int4_value(c.matrix(), 0, 5) == 0.25f);
    wf[7] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH_AS(quantize_weights_int4(wf.data(), n, k, 32), doctest::Contains("[0, 7]"), Error);
    std::vector<float> huge{-1e6f, 1e6f};
    CHECK_THROWS_WITH_AS(quantize_weights_int4(huge.data(), 1, 2, 32), doctest::Contains("f16"), Error);
}

TEST_CASE("quantize_weights_int4 from f16 / bf16 rows: the bits of the widened f32 matrix's, errors at their element") {
    std::mt19937 rng(12);
    const int64_t n = 6, k = 96;
    const std::vector<float> w = random_f32(size_t(n * k), rng, 0.05f);
    for (DType dt : {DType::kF16, DType::kBF16}) {
        INFO(dtype_name(dt));
        auto [h, widened] = round_to_16bit(w, dt);
        const Int4Weights a = quantize_weights_int4(h.data(), dt, n, k, 32);
        const Int4Weights b = quantize_weights_int4(widened.data(), n, k, 32);
        CHECK(a.qs == b.qs);
        CHECK(a.d == b.d);
        CHECK(a.m == b.m);
        h[size_t(3 * k + 40)] = dt == DType::kF16 ? uint16_t(0x7C00) : uint16_t(0x7F80);  // +Inf
        CHECK_THROWS_WITH_AS(quantize_weights_int4(h.data(), dt, n, k, 32), doctest::Contains("[3, 40]"), Error);
    }
    const std::vector<int8_t> i8(64);
    CHECK_THROWS_WITH_AS(quantize_weights_int4(i8.data(), DType::kI8, 1, 64, 32), doctest::Contains("i8"), Error);
}

TEST_CASE("int4: bad weights and calls are refused with the culprit named") {
    ThreadPool pool(1);
    Int4Weights z(2, 64, 32, Int4Kind::kZeroPoint);
    z.z[3] = 17;
    CHECK_THROWS_WITH_AS(pack_int4_weights(z.matrix(), IsaLevel::kScalar), doctest::Contains("zero point 17"), Error);
    Int4Weights d(2, 64, 32, Int4Kind::kOffset8);
    d.d[1] = 0x7C00;  // +inf in f16
    CHECK_THROWS_WITH_AS(pack_int4_weights(d.matrix(), IsaLevel::kScalar), doctest::Contains("channel 0 group 1"),
                         Error);
    Int4Matrix bad = d.matrix();
    bad.group = 48;
    CHECK_THROWS_WITH_AS(pack_int4_weights(bad, IsaLevel::kScalar), doctest::Contains("group size 48"), Error);
    Int4Weights g16(2, 64, 16, Int4Kind::kAffine);
    CHECK_THROWS_WITH_AS(pack_int4_weights(g16.matrix(), IsaLevel::kScalar), doctest::Contains("group size 16"), Error);
    CHECK_THROWS_WITH_AS(quantize_weights_int4(std::vector<float>(64).data(), 1, 64, 16).n,
                         doctest::Contains("group 16"), Error);
    Int4Weights p2(2, 64, 32, Int4Kind::kOffset8);
    p2.perm.assign(64, 0);  // not a permutation
    CHECK_THROWS_WITH_AS(pack_int4_weights(p2.matrix(), IsaLevel::kScalar), doctest::Contains("permutation"), Error);
    Int4Weights ok(2, 64, 32, Int4Kind::kAffine);
    PackedInt4 p = pack_int4_weights(ok.matrix(), IsaLevel::kScalar);
    std::vector<float> x(63), y(2);
    CHECK_THROWS_WITH_AS(gemm_w4a8(x.data(), 1, 63, p, y.data(), pool), doctest::Contains("k = 63"), Error);
    CHECK_THROWS_WITH_AS(gemm_w4a16(x.data(), 1, 63, p, y.data(), pool), doctest::Contains("k = 63"), Error);
    CHECK_THROWS_AS(gemm_w4a8(x.data(), 1, 64, PackedInt4{}, y.data(), pool), Error);
}

TEST_CASE("int4: an act-order permutation gathers the activations: equal to the gathered rows without one") {
    ThreadPool pool(1);
    std::mt19937 rng(21);
    const int64_t n = 40, k = 96, m = 5;
    for (Int4Kind kind : kKinds) {
        CAPTURE(int4_kind_name(kind));
        Int4Weights w = random_int4(n, k, 32, kind, rng);
        Int4Weights wp = w;
        wp.perm.resize(size_t(k));
        for (int64_t c = 0; c < k; ++c) wp.perm[size_t(c)] = int32_t(c);
        std::shuffle(wp.perm.begin(), wp.perm.end(), rng);
        std::vector<float> x = random_f32(size_t(m * k), rng), xg(x.size());
        for (int64_t r = 0; r < m; ++r)
            for (int64_t c = 0; c < k; ++c) xg[size_t(r * k + c)] = x[size_t(r * k + wp.perm[size_t(c)])];
        std::vector<float> deq(size_t(n * k));
        dequantize_packed_int4(pack_int4_weights(wp.matrix(), IsaLevel::kScalar), deq.data());
        for (int64_t c = 0; c < k; ++c)  // stored column c is input channel perm[c]
            REQUIRE(deq[size_t(3 * k + wp.perm[size_t(c)])] == int4_value(w.matrix(), 3, c));
        for (IsaLevel isa : supported_isas()) {
            CAPTURE(isa_name(isa));
            const PackedInt4 p = pack_int4_weights(w.matrix(), isa), pp = pack_int4_weights(wp.matrix(), isa);
            for (int64_t mm : {int64_t(1), m}) {
                auto a = run_poisoned(mm, n, [&](float* y) { gemm_w4a8(xg.data(), mm, k, p, y, pool); });
                auto b = run_poisoned(mm, n, [&](float* y) { gemm_w4a8(x.data(), mm, k, pp, y, pool); });
                CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
                auto c = run_poisoned(mm, n, [&](float* y) { gemm_w4a16(xg.data(), mm, k, p, y, pool); });
                auto d = run_poisoned(mm, n, [&](float* y) { gemm_w4a16(x.data(), mm, k, pp, y, pool); });
                CHECK(std::memcmp(c.data(), d.data(), c.size() * 4) == 0);
            }
        }
    }
}

}  // namespace test_int4_gemm
