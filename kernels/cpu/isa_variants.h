// Per-ISA variants of the portable vector loops (ops.cpp, attention): one always-inline body, compiled three
// times in the same translation unit, for the baseline ISA, for AVX2 and for AVX-512F, by GCC / clang target
// attributes, and picked per call by the one decision (isa.h), not by the loader (what target_clones did):
// LATTICE_ISA=scalar reaches these loops too.
//
// The bodies are written on GCC vector extensions or plain loops in a fixed order, so each variant performs
// the same IEEE operations lane for lane, except that the compiler contracts a multiply and an add into one
// FMA where the target has FMA instructions: AVX-512F does (it has its own), the baseline and the AVX2 set
// named here do not. So avx2 gives the scalar bits and avx512 differs from them by rounding only (as the
// target_clones these replace did; tests/kernels/cpu/test_isa.cpp checks both).
//
// Why attributes in one file rather than one file per ISA compiled with -mavx512f: a body's helpers
// (inline functions from headers, std:: templates) are then compiled once for the baseline and inlined into
// each variant; a per-ISA file would emit its own AVX-512 copy of each such helper under the same symbol
// name, and the linker could hand that copy to baseline callers.
//
// LATTICE_ISA_VARIANTS(ret, name, params, args) defines name_scalar, name_avx2, name_avx512 (each calling
// the always-inline `name args`) and `constexpr IsaVariants<ret(*) params> name_variants`.
#pragma once

#include "kernels/cpu/isa.h"

namespace lattice {

#if defined(__x86_64__)
#define LATTICE_TARGET_AVX2 __attribute__((target("avx2")))
#define LATTICE_TARGET_AVX512 __attribute__((target("avx512f")))
// The AVX-512 forms that also use vdpbf16ps (chosen per call by CpuFeatures::avx512bf16, never by the level).
#define LATTICE_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define LATTICE_TARGET_AVX2
#define LATTICE_TARGET_AVX512
#define LATTICE_TARGET_AVX512BF16
#endif

// The three forms of one function; `at` picks the one for a level (vector_level of it).
template <class Fn>
struct IsaVariants {
    Fn scalar, avx2, avx512;
    constexpr Fn at(IsaLevel isa) const {
        const IsaLevel v = vector_level(isa);
        return v == IsaLevel::kAvx512Vnni ? avx512 : v == IsaLevel::kAvx2 ? avx2 : scalar;
    }
};

#define LATTICE_ISA_VARIANTS(ret, name, params, args)                                               \
    ret name##_scalar params { return name args; }                                                  \
    LATTICE_TARGET_AVX2 ret name##_avx2 params { return name args; }                                \
    LATTICE_TARGET_AVX512 ret name##_avx512 params { return name args; }                            \
    constexpr ::lattice::IsaVariants<ret(*) params> name##_variants{name##_scalar, name##_avx2, name##_avx512};

}  // namespace lattice
