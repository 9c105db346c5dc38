// vdpbf16ps with a broadcast pair (AVX512_BF16), shared by the bf16-dot attention (attention_kernels.cpp) and the
// bf16-pair GEMM (gemm_bf16.cpp).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/isa_variants.h"

namespace lattice::cpu {

// acc + the pairs of x times the pair at p (two bf16) in every lane: lane i adds x[2i] * p[0] and x[2i + 1] * p[1].
// The pair is the instruction's memory operand, broadcast ({1to16}): as an intrinsic GCC 12 emits a separate
// vpbroadcastd for it, one more uop per vdpbf16ps.
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline __m512 dot_pairs(__m512 acc, __m512i x, const void* p) {
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*static_cast<const uint32_t*>(p)));
    return acc;
}

}  // namespace lattice::cpu
#endif
