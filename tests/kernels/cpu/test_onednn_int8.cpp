// The oneDNN provider of the W8A8 / s8s8 GEMMs (kernels/cpu/onednn_int8.h): int32 sums bit-equal to
// lattice's VNNI kernel and to the naive reference on the shapes the models use (TinyLlama's 2048 / 5632,
// Llama-7B's 4096 / 11008) plus tails in m, n (chunks of 256) and k (not a multiple of 4 or 64), the
// saturation corners up to kInt8MaxK, and W8A8's float output identical bit for bit (same epilogue
// operations); m < kInt8OnednnMinM stays on lattice's kernels. The [onednn] cases SKIP with the reason
// where the build has no libdnnl or the CPU no AVX-512 VNNI (their own ctest entry); the provider policy
// case runs everywhere.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/onednn_int8.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/test_skip.h"

using namespace lattice;
using namespace lattice::test;

namespace {

// Why the oneDNN cases cannot run here ("" when they can).
std::string onednn_skip_reason() {
    if (!onednn_compiled()) return "built without oneDNN (libdnnl-dev absent at configure time)";
    if (!isa_supported(IsaLevel::kAvx512Vnni)) return "the CPU has no AVX-512 VNNI (oneDNN serves avx512 and amx)";
    return {};
}

// The level oneDNN runs at here: amx where granted, else avx512.
IsaLevel onednn_level() { return isa_supported(IsaLevel::kAmx) ? IsaLevel::kAmx : IsaLevel::kAvx512Vnni; }

constexpr int32_t kPoison = 0x7eadbeef;

// gemm_s8s8_s32 through w into a poisoned buffer; returns c.
std::vector<int32_t> s8(const std::vector<int8_t>& a, int64_t m, int64_t k, const PackedInt8& w, ThreadPool& pool) {
    std::vector<int32_t> c(size_t(m * w.n), kPoison);
    gemm_s8s8_s32(a.data(), m, k, w, c.data(), pool);
    return c;
}

// oneDNN's int32 sums against lattice's avx512 kernel (and the naive reference where `naive`).
void check_s8_equal(const std::vector<int8_t>& a, const std::vector<int8_t>& q, int64_t m, int64_t n, int64_t k,
                    bool naive, ThreadPool& pool) {
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    PackedInt8 own = pack_int8_weights(q.data(), n, k, IsaLevel::kAvx512Vnni);
    REQUIRE(!own.onednn);
    PackedInt8 od;
    {
        ProviderGuard g(Int8Provider::kOnednn);
        od = pack_int8_weights(q.data(), n, k, onednn_level());
    }
    REQUIRE(od.onednn);
    const std::vector<int32_t> c_own = s8(a, m, k, own, pool);
    CHECK(last_int8_provider() == "own");
    const std::vector<int32_t> c_od = s8(a, m, k, od, pool);
    CHECK(last_int8_provider() == (m >= kInt8OnednnMinM ? "onednn" : "own"));
    CHECK(std::memcmp(c_own.data(), c_od.data(), c_own.size() * sizeof(int32_t)) == 0);
    if (naive) {
        const std::vector<int64_t> ref = naive_s8(a.data(), q.data(), m, n, k);
        int64_t bad = 0;
        for (size_t i = 0; i < ref.size(); ++i) bad += int64_t(c_od[i]) != ref[i];
        CHECK(bad == 0);
    }
}

}  // namespace

TEST_CASE("onednn: the provider policy (auto: amx only; own; onednn at avx512 and amx)") {
    ProviderGuard g(Int8Provider::kAuto);
    CHECK(!int8_uses_onednn(IsaLevel::kAvx512Vnni));  // measured slower than lattice's VNNI kernel
    CHECK(int8_uses_onednn(IsaLevel::kAmx) == onednn_compiled());
    set_int8_provider(Int8Provider::kOwn);
    CHECK(!int8_uses_onednn(IsaLevel::kAmx));
    set_int8_provider(Int8Provider::kOnednn);
    CHECK(int8_uses_onednn(IsaLevel::kAvx512Vnni));
    CHECK(int8_uses_onednn(IsaLevel::kAmx));
    CHECK(!int8_uses_onednn(IsaLevel::kAvx2));  // its operand form is int16, not oneDNN's u8
    CHECK(parse_int8_provider("onednn") == Int8Provider::kOnednn);
    CHECK(parse_int8_provider("own") == Int8Provider::kOwn);
    CHECK_THROWS_AS(parse_int8_provider("mkl"), Error);
    if (!onednn_compiled()) {
        const std::vector<int8_t> q(64, 1);
        CHECK_THROWS_AS(pack_int8_weights(q.data(), 4, 16, IsaLevel::kAvx512Vnni), Error);
    }
}

TEST_CASE("onednn: int32 sums equal the VNNI kernel and the reference, model shapes and tails [onednn]") {
    if (const std::string why = onednn_skip_reason(); !why.empty()) LATTICE_SKIP(why);
    ThreadPool pool(2);
    std::mt19937 rng(53);
    // (m, n, k): tails in m; n = 300 is one full chunk and a 44-wide one; k = 1001 off every block size.
    struct Shape { int64_t m, n, k; bool naive; };
    const Shape shapes[] = {{16, 300, 1001, true}, {33, 2048, 2048, false}, {17, 5632, 2048, false},
                            {128, 4096, 4096, false}, {16, 4096, 11008, false}, {5, 300, 1001, true}};
    for (const Shape& s : shapes) {
        const std::vector<int8_t> a = random_i8(size_t(s.m * s.k), rng);
        const std::vector<int8_t> q = random_i8(size_t(s.n * s.k), rng);
        check_s8_equal(a, q, s.m, s.n, s.k, s.naive, pool);
    }
}

TEST_CASE("onednn: saturation corners are exact up to kInt8MaxK [onednn]") {
    if (const std::string why = onednn_skip_reason(); !why.empty()) LATTICE_SKIP(why);
    ThreadPool pool(2);
    const int64_t m = 16, n = 17;
    for (int64_t k : {int64_t(4096), kInt8MaxK})
        for (int v : {127, -128}) {
            // a + 128 = 255 (or 0) against q = 127 (or -128): oneDNN's u8 sums wrap in int32 for 127 x 127 at
            // kInt8MaxK (255 * 127 * k > 2^31) and the correction must restore the exact value.
            const std::vector<int8_t> a(size_t(m * k), int8_t(v)), q(size_t(n * k), int8_t(v));
            check_s8_equal(a, q, m, n, k, true, pool);
        }
}

TEST_CASE("onednn: W8A8 float output bit-identical to the VNNI kernel [onednn]") {
    if (const std::string why = onednn_skip_reason(); !why.empty()) LATTICE_SKIP(why);
    ThreadPool pool(2);
    std::mt19937 rng(54);
    const int64_t n = 2100, k = 2048;
    const std::vector<float> wf = random_f32(size_t(n * k), rng, 0.02f);
    std::vector<int8_t> q(size_t(n * k));
    std::vector<float> sw(static_cast<size_t>(n));
    quantize_weights_per_channel(wf.data(), n, k, q.data(), sw.data());
    PackedInt8 own = pack_int8_weights(q.data(), n, k, IsaLevel::kAvx512Vnni), od;
    {
        ProviderGuard g(Int8Provider::kOnednn);
        od = pack_int8_weights(q.data(), n, k, onednn_level());
        CHECK(!pack_int8_weights(q.data(), n, k, onednn_level(), false).onednn);  // W8A16-only weights: no copy
    }
    for (int64_t m : {int64_t(1), int64_t(16), int64_t(100)}) {
        CAPTURE(m);
        const std::vector<float> x = random_f32(size_t(m * k), rng);
        std::vector<float> y_own(size_t(m * n), -1.0f), y_od(size_t(m * n), -2.0f);
        gemm_w8a8(x.data(), m, k, own, sw.data(), y_own.data(), pool);
        gemm_w8a8(x.data(), m, k, od, sw.data(), y_od.data(), pool);
        CHECK(last_int8_provider() == (m >= kInt8OnednnMinM ? "onednn" : "own"));
        CHECK(std::memcmp(y_own.data(), y_od.data(), y_own.size() * sizeof(float)) == 0);
    }
    MESSAGE(onednn_describe(), ": ", onednn_int8_impl(*od.onednn, 128, (k + 63) / 64 * 64));
}

TEST_CASE(
    "onednn: the bf16-pair GEMM's provider (--dtype bf16): the rows of oneDNN's matmul within f32 rounding of "
    "the pairs' [onednn]") {
    if (const std::string why = onednn_skip_reason(); !why.empty()) LATTICE_SKIP(why);
    if (!gemm_bf16_dot_available()) LATTICE_SKIP("the CPU has no AVX512_BF16 (the bf16 pairs and their provider)");
    ThreadPool pool(2);
    std::mt19937 rng(55);
    const int64_t n = 300, k = 1000;  // a partial chunk (256 + 44 columns), k not a multiple of 32
    const std::vector<float> wf = random_f32(size_t(n * k), rng, 0.05f);
    const PackedBf16 own = pack_bf16_weights(wf.data(), DType::kF32, n, k);
    CHECK(!own.onednn);  // auto: oneDNN at the amx level only
    PackedBf16 od;
    {
        ProviderGuard g(Int8Provider::kOnednn);
        od = pack_bf16_weights(wf.data(), DType::kF32, n, k);
    }
    REQUIRE(od.onednn);
    CHECK(od.data == own.data);  // the pairs' panels are the same either way
    CHECK(od.bytes() > own.bytes());
    for (int64_t m : {int64_t(5), int64_t(16), int64_t(70)}) {
        CAPTURE(m);
        const std::vector<float> x = random_f32(size_t(m * k), rng);
        std::vector<float> y_own(size_t(m * n), -1.0f), y_od(size_t(m * n), -2.0f);
        gemm_bf16_dot(x.data(), m, own, y_own.data(), pool);
        gemm_bf16_dot(x.data(), m, od, y_od.data(), pool);
        if (m < kInt8OnednnMinM) {  // decode rows: always the pairs
            CHECK(std::memcmp(y_own.data(), y_od.data(), y_own.size() * sizeof(float)) == 0);
            continue;
        }
        double worst = 0;
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                double mag = 0;
                for (int64_t p = 0; p < k; ++p)
                    mag += std::fabs(double(bf16_to_f32(f32_to_bf16(x[size_t(i * k + p)]))) *
                                     double(bf16_to_f32(f32_to_bf16(wf[size_t(j * k + p)]))));
                const double d = std::fabs(double(y_own[size_t(i * n + j)]) - double(y_od[size_t(i * n + j)]));
                worst = std::max(worst, d / (mag + 1e-30));
            }
        MESSAGE("m ", m, ": worst |pairs - oneDNN| / magnitude ", worst);
        CHECK(worst < 2.4e-7 * double(k / 2 + 2));  // both within f32 rounding of the exact sum
        CHECK(y_own != y_od);                       // oneDNN ran (its own order of sums)
    }
    MESSAGE(onednn_describe(), ": ", onednn_bf16_impl(*od.onednn, 70, (k + 31) / 32 * 32));
}
