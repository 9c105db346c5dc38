// Test helper: a tiny llama GGUF whose linears are K-quant super-blocks (Q4_K / Q5_K / Q6_K, chosen per tensor,
// as llama.cpp's Q4_K_M / Q5_K_M mix them) of random bytes with sane f16 scales (random 6-bit sub-block scales
// and minimums, random quants), f32 norms, a tied embedding of a chosen type; for the plan of a 4-bit run
// (which linears stay 4-bit), --quant auto, the tp split of a super-block, a non-finite scale, and the W4A16
// forward of an all-Q4_K model against its f32 read (the only difference: the repack's f16 rounding of d * sc).
// Shape: hidden 256, 1 layer, 2 heads of 128 and 1 kv head, ffn 256, vocab 16 (every row whole super-blocks).
#pragma once

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "tests/kernels/common/int4_test_util.h"
#include "tests/runtime/weights/gguf_builder.h"

namespace lattice::test {

struct KTypes {
    DType embed = DType::kQ4_K;
    DType q = DType::kQ4_K, k = DType::kQ4_K, v = DType::kQ6_K, o = DType::kQ4_K;
    DType gate = DType::kQ4_K, up = DType::kQ4_K, down = DType::kQ6_K;
};

inline constexpr int64_t kKH = 256, kKF = 256, kKV = 16, kKHeadDim = 128;

inline uint32_t k_ggml_type_of(DType t) {
    switch (t) {
        case DType::kQ4_K:
            return 12;
        case DType::kQ5_K:
            return 13;
        case DType::kQ6_K:
            return 14;
        case DType::kQ8_0:
            return 8;
        default:
            return 0;  // f32: not produced by k_tensor_bytes
    }
}

// The file's bytes (GgufBuilder image); `patch` may change a tensor's data (by GGUF name) before it is laid out.
inline std::vector<uint8_t> kquant_llama_gguf(
    const KTypes& ty, uint32_t seed = 5,
    const std::function<void(const std::string&, std::vector<uint8_t>&)>& patch = {}) {
    std::mt19937 rng(seed);
    const auto norm = norm_weight_bytes;
    const uint64_t H = kKH, F = kKF, HD = kKHeadDim;
    GgufBuilder g;
    add_one_layer_llama_kv(g, H, F, 2, 1);
    auto lin = [&](const char* name, DType t, uint64_t rows, uint64_t cols) {
        std::vector<uint8_t> data = k_tensor_bytes(t, int64_t(rows), int64_t(cols), rng);
        if (patch) patch(name, data);
        g.tensor(name, k_ggml_type_of(t), {cols, rows}, std::move(data));
    };
    lin("token_embd.weight", ty.embed, kKV, H);
    g.tensor("output_norm.weight", 0, {H}, norm(int64_t(H)));
    g.tensor("blk.0.attn_norm.weight", 0, {H}, norm(int64_t(H)));
    g.tensor("blk.0.ffn_norm.weight", 0, {H}, norm(int64_t(H)));
    lin("blk.0.attn_q.weight", ty.q, 2 * HD, H);
    lin("blk.0.attn_k.weight", ty.k, HD, H);
    lin("blk.0.attn_v.weight", ty.v, HD, H);
    lin("blk.0.attn_output.weight", ty.o, H, 2 * HD);
    lin("blk.0.ffn_gate.weight", ty.gate, F, H);
    lin("blk.0.ffn_up.weight", ty.up, F, H);
    lin("blk.0.ffn_down.weight", ty.down, H, F);
    return g.build();
}

}  // namespace lattice::test
