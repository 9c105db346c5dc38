// Helpers for the int8 kernel tests: deterministic random data, the ISA levels this CPU runs (and a scoped
// override of the decision), an independent naive int32 reference computed from the unpacked weights (int64
// accumulation).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/int8_gemm.h"

namespace lattice::test {

// Every level this CPU runs, capped by LATTICE_ISA when set (e.g. LATTICE_ISA=avx2 tests scalar and
// avx2 only, as on a CPU without VNNI). The kernels never read the environment; tests and launch/ do.
inline std::vector<IsaLevel> supported_isas() {
    IsaLevel cap = IsaLevel::kAmx;
    if (const char* e = std::getenv("LATTICE_ISA"); e && *e) cap = parse_isa(e);
    std::vector<IsaLevel> out;
    for (IsaLevel l : all_isa_levels())
        if (isa_supported(l) && l <= cap) out.push_back(l);
    return out;
}

// Sets the ISA override for a scope; the default decision again after it.
struct IsaOverride {
    explicit IsaOverride(IsaLevel l) { set_isa_override(l); }
    ~IsaOverride() { clear_isa_override(); }
    IsaOverride(const IsaOverride&) = delete;
    IsaOverride& operator=(const IsaOverride&) = delete;
};

// Sets the int8 GEMM provider for a scope (read when weights are packed); the previous one again after it.
struct ProviderGuard {
    explicit ProviderGuard(Int8Provider p) : old(int8_provider()) { set_int8_provider(p); }
    ~ProviderGuard() { set_int8_provider(old); }
    ProviderGuard(const ProviderGuard&) = delete;
    ProviderGuard& operator=(const ProviderGuard&) = delete;
    Int8Provider old;
};

inline std::vector<int8_t> random_i8(size_t n, std::mt19937& rng, int lo = -128, int hi = 127) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<int8_t> v(n);
    for (auto& x : v) x = int8_t(d(rng));
    return v;
}

inline std::vector<float> random_f32(size_t n, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// w rounded to f16 or bf16 (`dt`): the 16-bit values, and what they hold widened back to f32.
struct Rounded16 {
    std::vector<uint16_t> bits;
    std::vector<float> widened;
};
inline Rounded16 round_to_16bit(const std::vector<float>& w, DType dt) {
    Rounded16 r{std::vector<uint16_t>(w.size()), std::vector<float>(w.size())};
    for (size_t i = 0; i < w.size(); ++i) {
        r.bits[i] = dt == DType::kF16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
        r.widened[i] = dt == DType::kF16 ? f16_to_f32(r.bits[i]) : bf16_to_f32(r.bits[i]);
    }
    return r;
}

inline bool any_nonzero(const std::vector<int8_t>& v) {
    for (int8_t x : v)
        if (x != 0) return true;
    return false;
}

// c[m, n] = sum_k a[m, k] * q[n, k], int64 accumulation.
inline std::vector<int64_t> naive_s8(const int8_t* a, const int8_t* q, int64_t m, int64_t n, int64_t k) {
    std::vector<int64_t> c(size_t(m * n));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            int64_t s = 0;
            for (int64_t t = 0; t < k; ++t) s += int64_t(a[i * k + t]) * int64_t(q[j * k + t]);
            c[size_t(i * n + j)] = s;
        }
    return c;
}

}  // namespace lattice::test
