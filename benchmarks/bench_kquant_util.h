// What the K-quant benchmarks (bench_gemm_int4, bench_kquant_gemv) share: the process CPU time, random
// GGUF super-blocks of Q4_K / Q6_K with small f16 super-block scales (the kernels' time does not depend on
// the values; small scales keep the outputs finite), and the three layouts they compare packed from one
// random matrix.
#pragma once
#include <cstdint>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "kernels/common/int4_quantize.h"
#include "kernels/cpu/int4_gemm.h"

namespace lattice::bench {

inline double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Random super-blocks of `type` for [n, k] with small f16 super-block scales (d, and dmin for Q4_K).
inline std::vector<uint8_t> random_kquant_blocks(DType type, int64_t n, int64_t k, std::mt19937& rng) {
    const int64_t bb = dtype_block_bytes(type);
    std::vector<uint8_t> v(static_cast<size_t>(n * k / 256 * bb));
    for (auto& b : v) b = uint8_t(rng());
    const uint16_t d = f32_to_f16(type == DType::kQ4_K ? 1e-3f : 1e-4f);
    for (size_t o = 0; o < v.size(); o += size_t(bb)) {
        std::memcpy(&v[o + (type == DType::kQ6_K ? 208 : 0)], &d, 2);
        if (type == DType::kQ4_K) std::memcpy(&v[o + 2], &d, 2);
    }
    return v;
}

// One [n, k] matrix of N(0, 0.02) weights drawn from `rng`, packed for `isa` in the three layouts the
// benchmarks compare: [0] the group form (groups of 32: Q4_1's), [1] the Q4_K and [2] the Q6_K layout (the
// group form's weights with random super-blocks of that type, drawn next from `rng`).
inline std::vector<PackedInt4> pack_kquant_layouts(int64_t n, int64_t k, IsaLevel isa, std::mt19937& rng) {
    std::vector<float> f(static_cast<size_t>(n * k));
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (float& v : f) v = nd(rng);
    const Int4Weights w = quantize_weights_int4(f.data(), n, k, 32);
    f = {};
    std::vector<PackedInt4> packs;
    packs.push_back(pack_int4_weights(w.matrix(), isa, false));
    for (DType t : {DType::kQ4_K, DType::kQ6_K}) {
        Int4Weights wk = w;
        wk.kq.push_back(Int4KQuantPart{t, n, random_kquant_blocks(t, n, k, rng)});
        packs.push_back(pack_int4_weights(wk.matrix(), isa, true));
    }
    return packs;
}

}  // namespace lattice::bench
