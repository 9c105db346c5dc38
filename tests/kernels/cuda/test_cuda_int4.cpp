// CUDA W4A16 (kernels/cuda/int4_gemm.h) against the CPU W4A16 kernel (kernels/cpu/int4_gemm.h) on the same
// Int4Weights, uploaded in the device layout CudaBackend::make_linear_int4 uses:
//   - int4_gather_rows: the act-order gather and the zero padding to kp, exact;
//   - the decode GEMV for every kind (offset8, zero-point, affine), group 32 / 64 / 128, with and without an
//     act-order permutation, m = 1, 3, 8, n = 45 (not a multiple of a warp's 4 channels or a block's), k = 200
//     (off every group, so kp > k), f16 and bf16, out in the activation dtype and in f32; one k long enough
//     for the k-slices (kp / 32 >= 128 blocks);
//   - the tensor-core GEMM for the same kinds, groups and permutations at m = 9, 64, 100 (tails of the 64-row
//     tile), n = 45 and 200 (tails of the 128-column tile), x read directly (ldx = k, also k = 77: the scalar
//     x loads) or gathered (ldx = kp);
//   - outputs poisoned (NaN) with guard cells past m x n that must stay poisoned; bad arguments refused.
// Tolerances: cuda_test_util.h's per activation dtype (one rounding of the output; the GEMM also rounds each
// dequantized weight to the activation dtype once, 2^-12 / 2^-9 relative, well inside them). Inputs: x rounded
// to the activation dtype on the host, so both sides multiply the same values.
#include <cstring>

#include "base/error.h"
#include "tests/kernels/cuda/int4_test_util.h"

using namespace lattice;
using namespace lattice::test;

namespace {

constexpr Int4Kind kKinds[] = {Int4Kind::kOffset8, Int4Kind::kZeroPoint, Int4Kind::kAffine};
constexpr int64_t kGroups[] = {32, 64, 128};
const DType kActs[] = {DType::kF16, DType::kBF16};
constexpr int64_t kGuard = 37;  // poisoned output cells past m x n

// Output of m x n in out_dtype (act or f32) back as floats, and whether the guard cells stayed poisoned.
std::vector<float> read_out(const DevBuf& out, int64_t count, DType out_dtype, DType act, bool& guard_ok) {
    guard_ok = true;
    if (out_dtype == DType::kF32) {
        const std::vector<uint32_t> bits = out.download<uint32_t>(size_t(count + kGuard));
        for (int64_t i = count; i < count + kGuard; ++i) guard_ok &= bits[size_t(i)] == 0xFFFFFFFFu;
        std::vector<float> f(static_cast<size_t>(count));
        std::memcpy(f.data(), bits.data(), size_t(count) * 4);
        return f;
    }
    const std::vector<uint16_t> bits = out.download<uint16_t>(size_t(count + kGuard));
    for (int64_t i = count; i < count + kGuard; ++i) guard_ok &= bits[size_t(i)] == 0xFFFFu;
    return from_act(std::vector<uint16_t>(bits.begin(), bits.begin() + count), act);
}

// x [m, k] random, rounded to act: the floats and the device copy.
std::vector<float> random_x(std::mt19937_64& rng, int64_t m, int64_t k, DType act) {
    std::vector<float> x = random_vec(rng, size_t(m * k));
    for (auto& v : x) v = round_act(v, act);
    return x;
}

// Gathers x on the device into stored column order [m, kp] (poisoned first) and checks it exactly.
void gather_checked(DevBuf& xg, const DevBuf& dx, const std::vector<float>& x, const Int4Weights& w, const DevInt4& dw,
                    int64_t m, DType act) {
    const int64_t kp = w.k_padded();
    xg.poison();
    cuda::int4_gather_rows(xg.get(), dx.get(), dw.perm_ptr(), m, w.k, kp, act, nullptr);
    const std::vector<float> got = from_act(xg.download<uint16_t>(size_t(m * kp)), act);
    bool exact = true;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < kp; ++j) {
            const float want = j < w.k ? x[size_t(i * w.k + (w.perm.empty() ? j : w.perm[size_t(j)]))] : 0.0f;
            exact &= got[size_t(i * kp + j)] == want;
        }
    CHECK(exact);
}

void run_case(std::mt19937_64& rng, DType act, Int4Kind kind, int64_t group, bool perm, int64_t m, int64_t n, int64_t k,
              bool gemv) {
    INFO(dtype_name(act) << " " << int4_kind_name(kind) << " group " << group << (perm ? " act-order" : "") << " m "
                         << m << " n " << n << " k " << k << (gemv ? " gemv" : " gemm"));
    const Int4Weights w = random_int4(n, k, group, kind, rng, perm);
    const DevInt4 dw(w);
    const std::vector<float> x = random_x(rng, m, k, act);
    const std::vector<float> ref = cpu_w4a16(w, x, m);
    REQUIRE(any_nonzero(ref));
    DevBuf dx(to_act(x, act)), xg(size_t(m * w.k_padded()) * 2);
    const bool gathered = gemv || perm;
    if (gathered) gather_checked(xg, dx, x, w, dw, m, act);
    for (DType od : {act, DType::kF32}) {
        INFO("out " << dtype_name(od));
        DevBuf out(size_t(m * n + kGuard) * size_t(dtype_size(od)));
        if (gemv)
            cuda::gemv_w4a16(out.get(), xg.get(), dw.dev, m, act, od, nullptr);
        else
            cuda::gemm_w4a16(out.get(), gathered ? xg.get() : dx.get(), gathered ? w.k_padded() : k, dw.dev, m, act, od,
                             nullptr);
        bool guard_ok = false;
        const std::vector<float> got = read_out(out, m * n, od, act, guard_ok);
        CHECK(guard_ok);
        // cuda_test_util.h's bound, plus one rounding of each dequantized weight where the tensor-core GEMM
        // converts it to the activation dtype ((q - z) * d is exact in fp32: 5 x 11 bits; q * d + min is
        // within 2^-24): errors of random sign, ~u of the output in all; 2u + u stays 2.7x (f16) under kTol.
        check_close(got, ref, m, n, act);
    }
}

}  // namespace

TEST_CASE("cuda W4A16 GEMV == CPU W4A16: every kind, group, act-order, m = 1, 3, 8" * doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs)
        for (Int4Kind kind : kKinds)
            for (int64_t group : kGroups)
                for (bool perm : {false, true})
                    for (int64_t m : {1, 3, 8}) run_case(rng, act, kind, group, perm, m, 45, 200, true);
    // k-slices: kp / 32 = 132 blocks (>= 128) and few channels, so a warp group splits k.
    for (Int4Kind kind : kKinds) run_case(rng, DType::kF16, kind, 64, true, 2, 45, 4200, true);
}

TEST_CASE("cuda W4A16 GEMM (tensor cores) == CPU W4A16: every kind, group, act-order, tile tails" *
          doctest::test_suite("cuda")) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (DType act : kActs)
        for (Int4Kind kind : kKinds)
            for (int64_t group : kGroups)
                for (bool perm : {false, true}) {
                    run_case(rng, act, kind, group, perm, 9, 45, 200, false);
                    run_case(rng, act, kind, group, perm, 100, 200, 200, false);
                }
    run_case(rng, DType::kF16, Int4Kind::kAffine, 128, false, 64, 200, 1000, false);
    run_case(rng, DType::kBF16, Int4Kind::kZeroPoint, 32, false, 17, 45, 77, false);  // ldx % 8 != 0: scalar x loads
    run_case(rng, DType::kBF16, Int4Kind::kZeroPoint, 32, false, 5, 45, 77, true);
}

TEST_CASE("cuda W4A16: bad arguments are refused naming them" * doctest::test_suite("cuda")) {
    std::mt19937_64 rng(7);
    const Int4Weights w = random_int4(8, 64, 32, Int4Kind::kOffset8, rng, false);
    const DevInt4 dw(w);
    DevBuf x(size_t(16 * 64) * 2), out(size_t(16 * 8) * 4);
    CHECK_THROWS_WITH_AS(cuda::gemv_w4a16(out.get(), x.get(), dw.dev, 9, DType::kF16, DType::kF16, nullptr),
                         doctest::Contains("gemv_w4a16: m = 9"), Error);
    cuda::Int4Dev bad = dw.dev;
    bad.group = 48;
    CHECK_THROWS_WITH_AS(cuda::gemm_w4a16(out.get(), x.get(), 64, bad, 4, DType::kF16, DType::kF16, nullptr),
                         doctest::Contains("group 48"), Error);
    CHECK_THROWS_WITH_AS(cuda::gemm_w4a16(out.get(), x.get(), 64, dw.dev, 4, DType::kF16, DType::kI8, nullptr),
                         doctest::Contains("output dtype"), Error);
    CHECK_THROWS_WITH_AS(cuda::gemm_w4a16(out.get(), x.get(), 32, dw.dev, 4, DType::kF16, DType::kF16, nullptr),
                         doctest::Contains("ldx 32"), Error);
}
