// The one CPU ISA decision (kernels/cpu/isa.h): the choice from simulated CPU features (AMX refused, absent,
// without the OS's tile state) and from simulated probes (the tile permission asked once, only where the CPU
// and the OS have AMX; LATTICE_ISA=amx without it an error naming why), the level names, and that the
// override reaches every kernel family: under
// the scalar level the int8 and 4-bit GEMMs (packed as the backend packs them, at detect_isa()), the float
// GEMM, attention and the elementwise loops each report the scalar kernel as the one that ran (last_path),
// and at every other level this CPU runs, the level's own form, with results that agree (GEMMs W8A8 / W4A8
// bit for bit; attention and the elementwise loops bit for bit at avx2, within rounding at avx512).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/int4_gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/int8_test_util.h"

using namespace lattice;

namespace {

CpuFeatures features(bool avx2, bool vnni, bool avx512) {
    CpuFeatures f;
    f.avx2 = avx2;
    f.avxvnni = vnni;
    f.avx512 = avx512;
    return f;
}

// Every family's outputs at the current level, each family's last path recorded.
struct FamilyRun {
    std::vector<float> gemm_int8, gemm_int4, gemm_f32, attention, rmsnorm, silu;
    double lse = 0;
    int64_t argmax = -1;
    float dot = 0;
};

FamilyRun run_every_family(ThreadPool& pool, DType kv) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto vec = [&](size_t n) {
        std::vector<float> v(n);
        for (auto& x : v) x = u(rng);
        return v;
    };
    FamilyRun r;
    const int64_t m = 3, n = 37, k = 72;
    const std::vector<float> x = vec(size_t(m * k));
    // GEMMs, packed at detect_isa() as the CPU backend packs them.
    std::vector<int8_t> q = test::random_i8(size_t(n * k), rng, -127, 127);
    std::vector<float> sw(size_t(n), 0.01f);
    const PackedInt8 p8 = pack_int8_weights(q.data(), n, k, detect_isa());
    r.gemm_int8.assign(size_t(m * n), std::nanf(""));
    gemm_w8a8(x.data(), m, k, p8, sw.data(), r.gemm_int8.data(), pool);
    Int4Weights w4(n, k, 32, Int4Kind::kAffine);
    for (auto& b : w4.qs) b = uint8_t(rng());
    for (auto& d : w4.d) d = f32_to_f16(0.01f);
    for (auto& mn : w4.m) mn = f32_to_f16(-0.05f);
    const PackedInt4 p4 = pack_int4_weights(w4.matrix(), detect_isa());
    r.gemm_int4.assign(size_t(m * n), std::nanf(""));
    gemm_w4a8(x.data(), m, k, p4, r.gemm_int4.data(), pool);
    const std::vector<float> wf = vec(size_t(n * k));
    r.gemm_f32.assign(size_t(m * n), std::nanf(""));
    gemm_f32(x.data(), m, k, wf.data(), DType::kF32, n, r.gemm_f32.data(), pool);
    // Attention: 21 tokens of one sequence in blocks of 16 (f32, bf16, int8: in place; f16: converted).
    const int64_t hd = 40, nh = 4, nkv = 2, block = 16, t = 21, width = 2, row = (nh + 2 * nkv) * hd;
    std::vector<int32_t> table = {1, 0};
    std::vector<int32_t> pos(static_cast<size_t>(t)), seq(static_cast<size_t>(t), 0);
    for (int64_t i = 0; i < t; ++i) pos[size_t(i)] = int32_t(i);
    const std::vector<float> qkv = vec(size_t(t * row));
    cpu::AttentionArgs a{nh, nkv, hd, block, 2, table.data(), 1, width, 1.0f / std::sqrt(float(hd)), 0, kv};
    std::vector<uint8_t> kc(size_t(2 * block * nkv * cpu::kv_row_bytes(kv, hd)), 0), vc = kc;
    r.attention.assign(size_t(t * nh * hd), std::nanf(""));
    cpu::attention(r.attention.data(), qkv.data(), kc.data(), vc.data(), pos.data(), seq.data(), t, a, pool);
    // Elementwise.
    const std::vector<float> res0 = vec(size_t(m * k)), nw = vec(size_t(k)), gu = vec(size_t(2 * m * k));
    r.rmsnorm.assign(size_t(2 * m * k), std::nanf(""));
    std::vector<float> res = res0;
    cpu::rmsnorm(r.rmsnorm.data(), x.data(), nw.data(), m, k, 1e-5f, pool);
    cpu::add_rmsnorm(res.data(), x.data(), r.rmsnorm.data() + m * k, nw.data(), m, k, 1e-5f, pool);
    r.silu.assign(size_t(m * k), std::nanf(""));
    cpu::silu_mul(r.silu.data(), gu.data(), m, k, pool);
    r.lse = cpu::log_sum_exp(x.data(), m * k);
    r.argmax = cpu::argmax(x.data(), m * k);
    r.dot = cpu::dot(x.data(), x.data() + k, k);
    return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// |a - b| <= tol * (1 + |b|) elementwise (and equal sizes).
bool close(const std::vector<float>& a, const std::vector<float>& b, double tol) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (!(std::fabs(double(a[i]) - double(b[i])) <= tol * (1.0 + std::fabs(double(b[i]))))) return false;
    return true;
}

bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

}  // namespace

TEST_CASE("isa: the decision from simulated CPU features, AMX refused or absent") {
    CHECK(choose_isa(features(false, false, false)).best == IsaLevel::kScalar);
    CHECK(choose_isa(features(true, false, false)).best == IsaLevel::kAvx2);
    CHECK(choose_isa(features(true, true, false)).best == IsaLevel::kAvxVnni);
    CHECK(choose_isa(features(true, true, true)).best == IsaLevel::kAvx512Vnni);
    CHECK(choose_isa(features(true, false, true)).best == IsaLevel::kAvx512Vnni);
    CHECK(choose_isa(features(true, true, true)).amx_note.find("no AMX") != std::string::npos);

    CpuFeatures amx = features(true, true, true);
    amx.amx_cpu = amx.amx_os = amx.amx_granted = true;
    const IsaChoice granted = choose_isa(amx);
    CHECK(granted.best == IsaLevel::kAmx);
    CHECK(granted.amx_note.empty());

    amx.amx_granted = false;  // a kernel or VM that refuses the tile data permission
    amx.amx_refusal = "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: Invalid argument";
    const IsaChoice refused = choose_isa(amx);
    CHECK(refused.best == IsaLevel::kAvx512Vnni);
    CHECK(refused.amx_note.find("refused") != std::string::npos);
    CHECK(refused.amx_note.find("Invalid argument") != std::string::npos);

    amx.amx_os = false;  // the OS does not manage the tile state
    CHECK(choose_isa(amx).best == IsaLevel::kAvx512Vnni);
    CHECK(choose_isa(amx).amx_note.find("XCR0") != std::string::npos);

    amx = features(true, true, false);  // AMX without AVX-512 VNNI: not a level
    amx.amx_cpu = amx.amx_os = amx.amx_granted = true;
    CHECK(choose_isa(amx).best == IsaLevel::kAvxVnni);
}

namespace {
int g_requests = 0;
std::string refuse_permission() {
    ++g_requests;
    return "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: Operation not permitted";
}
std::string grant_permission() {
    ++g_requests;
    return {};
}
// A Sapphire Rapids-like probe: AVX-512 VNNI, AMX in CPUID, the tile state enabled in XCR0.
CpuProbe spr_probe(std::string (*request)()) {
    CpuProbe p;
    p.avx2 = p.avxvnni = p.avx512 = p.amx_cpu = true;
    p.xcr0 = 0x602e7;  // x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM, XTILECFG, XTILEDATA
    p.request_amx_permission = request;
    return p;
}
}  // namespace

TEST_CASE("isa: the tile permission is asked once, only where CPU and OS have AMX; refused or absent -> avx512") {
    g_requests = 0;
    const CpuFeatures refused = features_from_probe(spr_probe(&refuse_permission));
    CHECK(g_requests == 1);
    CHECK(!refused.amx_granted);
    const IsaChoice c = choose_isa(refused);
    CHECK(c.best == IsaLevel::kAvx512Vnni);
    CHECK(c.amx_note.find("Operation not permitted") != std::string::npos);

    g_requests = 0;
    const IsaChoice granted = choose_isa(features_from_probe(spr_probe(&grant_permission)));
    CHECK(g_requests == 1);
    CHECK(granted.best == IsaLevel::kAmx);

    g_requests = 0;
    CpuProbe no_amx = spr_probe(&grant_permission);  // CPUID without AMX (this AMD EPYC, Ice Lake ...)
    no_amx.amx_cpu = false;
    const IsaChoice absent = choose_isa(features_from_probe(no_amx));
    CHECK(g_requests == 0);  // never asked for
    CHECK(absent.best == IsaLevel::kAvx512Vnni);
    CHECK(absent.amx_note.find("no AMX") != std::string::npos);

    CpuProbe no_os = spr_probe(&grant_permission);  // a kernel or VM that does not enable the tile state
    no_os.xcr0 = 0xe7;
    const IsaChoice hidden = choose_isa(features_from_probe(no_os));
    CHECK(g_requests == 0);
    CHECK(hidden.best == IsaLevel::kAvx512Vnni);
    CHECK(hidden.amx_note.find("XCR0") != std::string::npos);

    // This machine's real probe agrees with the features the process uses (asked at most once: cached).
    const CpuProbe real = cpu_probe();
    CHECK(real.amx_cpu == cpu_features().amx_cpu);
    CHECK(real.avx512 == cpu_features().avx512);
    if (!isa_supported(IsaLevel::kAmx)) {  // forcing amx here: an error that says why
        try {
            set_isa_override(IsaLevel::kAmx);
            FAIL("set_isa_override(amx) did not throw");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find(std::string(amx_note())) != std::string::npos);
        }
    }
}

TEST_CASE("isa: names, parsing, this CPU's levels and the override") {
    for (IsaLevel l : all_isa_levels()) CHECK(parse_isa(isa_name(l)) == l);
    CHECK(parse_isa("amx") == IsaLevel::kAmx);
    CHECK_THROWS_AS(parse_isa("avx1024"), Error);
    CHECK(isa_supported(IsaLevel::kScalar));
    CHECK(isa_supported(best_isa()));
    for (IsaLevel l : all_isa_levels())
        CHECK(isa_supported(l) == (l <= best_isa() && (l != IsaLevel::kAvxVnni || cpu_features().avxvnni)));
    CHECK(amx_note().empty() == (best_isa() == IsaLevel::kAmx));
    CHECK(vector_level(IsaLevel::kAvxVnni) == IsaLevel::kAvx2);
    CHECK(vector_level(IsaLevel::kAmx) == IsaLevel::kAvx512Vnni);
    {
        test::IsaOverride o(IsaLevel::kScalar);
        CHECK(detect_isa() == IsaLevel::kScalar);
    }
    CHECK(detect_isa() == best_isa());
    if (!isa_supported(IsaLevel::kAmx)) CHECK_THROWS_AS(set_isa_override(IsaLevel::kAmx), Error);
    MESSAGE("best ISA on this CPU: ", isa_name(best_isa()), "; AMX: ", amx_note().empty() ? "used" : amx_note());
}

TEST_CASE("isa: every kernel family runs the overridden level's path; attention and elementwise bit-equal") {
    ThreadPool pool(2, false);
    const KernelFamily families[] = {KernelFamily::kGemmInt8, KernelFamily::kGemmInt4, KernelFamily::kGemmF32,
                                     KernelFamily::kAttention, KernelFamily::kElementwise};
    for (DType kv : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8}) {
        CAPTURE(dtype_name(kv));
        FamilyRun scalar;
        {
            test::IsaOverride o(IsaLevel::kScalar);
            clear_paths();
            scalar = run_every_family(pool, kv);
            for (KernelFamily f : families) {
                CAPTURE(kernel_family_name(f));
                REQUIRE(last_path(f).has_value());
                CHECK(*last_path(f) == IsaLevel::kScalar);
            }
        }
        CHECK(all_finite(scalar.gemm_int8));
        CHECK(all_finite(scalar.attention));
        CHECK(all_finite(scalar.rmsnorm));
        for (IsaLevel l : test::supported_isas()) {
            if (l == IsaLevel::kScalar) continue;
            CAPTURE(isa_name(l));
            test::IsaOverride o(l);
            clear_paths();
            const FamilyRun r = run_every_family(pool, kv);
            // The int8 GEMM has an AVX-VNNI form; the others run their vector_level form.
            CHECK(*last_path(KernelFamily::kGemmInt8) == (l == IsaLevel::kAmx ? IsaLevel::kAvx512Vnni : l));
            for (KernelFamily f : {KernelFamily::kGemmInt4, KernelFamily::kGemmF32, KernelFamily::kAttention,
                                   KernelFamily::kElementwise}) {
                CAPTURE(kernel_family_name(f));
                CHECK(*last_path(f) == vector_level(l));
            }
            // W8A8 and W4A8 are bit-identical across paths (their own tests check it at length).
            CHECK(same_bits(r.gemm_int8, scalar.gemm_int8));
            CHECK(same_bits(r.gemm_int4, scalar.gemm_int4));
            for (size_t i = 0; i < r.gemm_f32.size(); ++i)
                CHECK(std::fabs(r.gemm_f32[i] - scalar.gemm_f32[i]) <= 1e-5f * (1.0f + std::fabs(scalar.gemm_f32[i])));
            // The float loops: the same operations on every variant; only AVX-512F has FMA instructions the
            // compiler contracts into, so avx2 gives the scalar bits and avx512 agrees within rounding.
            if (vector_level(l) == IsaLevel::kAvx2) {
                CHECK(same_bits(r.attention, scalar.attention));
                CHECK(same_bits(r.rmsnorm, scalar.rmsnorm));
                CHECK(same_bits(r.silu, scalar.silu));
                CHECK(r.lse == scalar.lse);
                CHECK(r.dot == scalar.dot);
            }
            CHECK(close(r.attention, scalar.attention, 1e-5));
            CHECK(close(r.rmsnorm, scalar.rmsnorm, 1e-6));
            CHECK(close(r.silu, scalar.silu, 1e-6));
            CHECK(std::fabs(r.lse - scalar.lse) <= 1e-6 * std::fabs(scalar.lse));
            CHECK(std::fabs(r.dot - scalar.dot) <= 1e-5f * (1.0f + std::fabs(scalar.dot)));
            CHECK(r.argmax == scalar.argmax);
        }
    }
}
