// Test helper: a tiny llama GGUF whose linears are GGUF 4-bit blocks (Q4_0 / Q4_1, chosen per tensor), with
// sane random scales and minimums, random nibbles, a Q8_0 token embedding (tied LM head), f32 norms; for the
// 4-bit loading tests (raw block reads, the plan of a 4-bit run, exactness end to end).
// Shape: hidden 64, 1 layer, 2 heads and 2 kv heads of 32, ffn 96, vocab 40.
#pragma once

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "tests/runtime/weights/gguf_builder.h"

namespace lattice::test {

struct Q4Types {
    DType q = DType::kQ4_1, k = DType::kQ4_1, v = DType::kQ4_1, o = DType::kQ4_0;
    DType gate = DType::kQ4_1, up = DType::kQ4_1, down = DType::kQ4_0;
};

inline constexpr int64_t kQ4H = 64, kQ4F = 96, kQ4V = 40;

// Blocks of a [rows, cols] tensor of type t (q4_0, q4_1 or q8_0); d in [0.01, 0.11), m in (-0.3, 0]. f32 and f16
// tensors (for the float reads' tests) hold values in [-0.5, 0.5).
inline std::vector<uint8_t> q4_tensor_bytes(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
    if (t == DType::kF32 || t == DType::kF16) {
        std::vector<uint8_t> v(size_t(rows * cols * int64_t(dtype_size(t))));
        for (int64_t i = 0; i < rows * cols; ++i) {
            const float x = float(rng() % 1000) / 1000.0f - 0.5f;
            if (t == DType::kF32) {
                std::memcpy(&v[size_t(i) * 4], &x, 4);
            } else {
                const uint16_t h = f32_to_f16(x);
                std::memcpy(&v[size_t(i) * 2], &h, 2);
            }
        }
        return v;
    }
    const int64_t bb = dtype_block_bytes(t);
    std::vector<uint8_t> v(size_t(rows * cols / 32 * bb));
    for (auto& x : v) x = uint8_t(rng());
    for (size_t o = 0; o < v.size(); o += size_t(bb)) {
        const uint16_t d = f32_to_f16(0.01f + float(rng() % 100) * 1e-3f);
        std::memcpy(&v[o], &d, 2);
        if (t == DType::kQ4_1) {
            const uint16_t m = f32_to_f16(-0.05f * float(rng() % 7));
            std::memcpy(&v[o + 2], &m, 2);
        }
    }
    return v;
}

inline uint32_t ggml_type_of(DType t) {
    return t == DType::kQ4_0 ? 2 : t == DType::kQ4_1 ? 3 : t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 8;
}

// The file's bytes (GgufBuilder image); `patch` may change a tensor's data (by GGUF name) before it is laid out.
inline std::vector<uint8_t> q4_llama_gguf(
    const Q4Types& ty, uint32_t seed = 11,
    const std::function<void(const std::string&, std::vector<uint8_t>&)>& patch = {}) {
    std::mt19937 rng(seed);
    const auto norm = norm_weight_bytes;
    const uint64_t H = kQ4H, F = kQ4F;
    GgufBuilder g;
    add_one_layer_llama_kv(g, H, F, 2, 2);
    auto lin = [&](const char* name, DType t, uint64_t rows, uint64_t cols) {
        std::vector<uint8_t> data = q4_tensor_bytes(t, int64_t(rows), int64_t(cols), rng);
        if (patch) patch(name, data);
        g.tensor(name, ggml_type_of(t), {cols, rows}, std::move(data));
    };
    lin("token_embd.weight", DType::kQ8_0, kQ4V, H);
    g.tensor("output_norm.weight", 0, {H}, norm(int64_t(H)));
    g.tensor("blk.0.attn_norm.weight", 0, {H}, norm(int64_t(H)));
    g.tensor("blk.0.ffn_norm.weight", 0, {H}, norm(int64_t(H)));
    lin("blk.0.attn_q.weight", ty.q, H, H);
    lin("blk.0.attn_k.weight", ty.k, H, H);
    lin("blk.0.attn_v.weight", ty.v, H, H);
    lin("blk.0.attn_output.weight", ty.o, H, H);
    lin("blk.0.ffn_gate.weight", ty.gate, F, H);
    lin("blk.0.ffn_up.weight", ty.up, F, H);
    lin("blk.0.ffn_down.weight", ty.down, H, F);
    return g.build();
}

// Writes bytes to `path` (in the build folder); returns the path.
inline std::string write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::FILE* fp = std::fopen(path.c_str(), "wb");
    if (!fp || std::fwrite(bytes.data(), 1, bytes.size(), fp) != bytes.size()) std::abort();
    std::fclose(fp);
    return path;
}

}  // namespace lattice::test
