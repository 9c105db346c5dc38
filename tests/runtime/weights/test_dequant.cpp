// Block dequantization (Q8_0, Q4_0, Q4_1) against hand-built blocks with known values, row-slice
// conversion to f32/f16/bf16, and GgufSource::read() of quantized slices from a synthetic file.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/weights/dequant.h"
#include "runtime/weights/gguf.h"
#include "tests/runtime/weights/gguf_builder.h"

using namespace lattice;
using lattice::test::GgufBuilder;

namespace {

void put_f16(std::vector<uint8_t>& b, float v) {
    GgufBuilder::put<uint16_t>(b, f32_to_f16(v));
}

// One Q4_x block from 32 nibbles (element order: k < 16 in low nibbles of byte k, k >= 16 in high nibbles).
void put_nibbles(std::vector<uint8_t>& b, const uint8_t* nib) {
    for (int k = 0; k < 16; ++k) b.push_back(uint8_t(nib[k] | (nib[k + 16] << 4)));
}

}  // namespace

TEST_CASE("dequant: Q8_0 blocks") {
    std::vector<uint8_t> b;
    std::vector<float> want;
    const float ds[2] = {0.5f, -0.125f};
    for (int blk = 0; blk < 2; ++blk) {
        put_f16(b, ds[blk]);
        for (int k = 0; k < 32; ++k) {
            int8_t q = int8_t(k * 7 - 100 + blk * 3);  // spans negatives and positives, includes -100
            b.push_back(uint8_t(q));
            want.push_back(float(q) * ds[blk]);
        }
    }
    REQUIRE(b.size() == 68);
    std::vector<float> out(64, -999.0f);
    dequant_q8_0(b.data(), out.data(), 64);
    CHECK(out == want);
    CHECK(out[0] == -50.0f);  // -100 * 0.5
    CHECK(out[32] == -97.0f * -0.125f);
}

TEST_CASE("dequant: Q4_0 nibble order and offset") {
    std::vector<uint8_t> b;
    uint8_t nib[32];
    for (int k = 0; k < 32; ++k) nib[k] = uint8_t((k * 5 + 3) % 16);
    put_f16(b, 0.25f);
    put_nibbles(b, nib);
    REQUIRE(b.size() == 18);
    std::vector<float> out(32, -999.0f);
    dequant_q4_0(b.data(), out.data(), 32);
    for (int k = 0; k < 32; ++k) CHECK(out[k] == float(int(nib[k]) - 8) * 0.25f);
    // Explicit: element 0 is low nibble of byte 0 (3 -> -5 * 0.25), element 16 its high nibble.
    CHECK(out[0] == -1.25f);
    CHECK(out[16] == float(int((16 * 5 + 3) % 16) - 8) * 0.25f);
    CHECK((b[2] >> 4) == nib[16]);
}

TEST_CASE("dequant: Q4_1 scale and min") {
    std::vector<uint8_t> b;
    uint8_t nib[2][32];
    const float d[2] = {0.5f, 2.0f}, m[2] = {-3.0f, 1.5f};
    for (int blk = 0; blk < 2; ++blk) {
        for (int k = 0; k < 32; ++k) nib[blk][k] = uint8_t((k * 11 + blk) % 16);
        put_f16(b, d[blk]);
        put_f16(b, m[blk]);
        put_nibbles(b, nib[blk]);
    }
    REQUIRE(b.size() == 40);
    std::vector<float> out(64, -999.0f);
    dequant_q4_1(b.data(), out.data(), 64);
    for (int blk = 0; blk < 2; ++blk)
        for (int k = 0; k < 32; ++k) CHECK(out[blk * 32 + k] == float(nib[blk][k]) * d[blk] + m[blk]);
    CHECK(out[0] == -3.0f);        // nibble 0
    CHECK(out[32 + 15] == 13.5f);  // nibble (15*11+1)%16 = 6: 6*2 + 1.5
}

TEST_CASE("dequant: convert_row_slice to f32/f16/bf16 and slice checks") {
    std::vector<uint8_t> b;
    std::vector<float> ref;
    std::mt19937 rng(7);
    for (int blk = 0; blk < 3; ++blk) {
        float d = 0.01f * float(blk + 1);
        put_f16(b, d);
        for (int k = 0; k < 32; ++k) {
            int8_t q = int8_t(int(rng() % 255) - 127);
            b.push_back(uint8_t(q));
            ref.push_back(float(q) * f16_to_f32(f32_to_f16(d)));
        }
    }
    std::vector<float> f(32, -1);
    convert_row_slice(b.data(), DType::kQ8_0, 32, 32, f.data(), DType::kF32);
    for (int k = 0; k < 32; ++k) CHECK(f[k] == ref[32 + k]);
    std::vector<uint16_t> h(64, 0xffff);
    convert_row_slice(b.data(), DType::kQ8_0, 32, 64, h.data(), DType::kF16);
    for (int k = 0; k < 64; ++k) CHECK(h[k] == f32_to_f16(ref[32 + k]));
    convert_row_slice(b.data(), DType::kQ8_0, 0, 64, h.data(), DType::kBF16);
    for (int k = 0; k < 64; ++k) CHECK(h[k] == f32_to_bf16(ref[k]));
    CHECK_THROWS_AS(convert_row_slice(b.data(), DType::kQ8_0, 16, 32, f.data(), DType::kF32), Error);
    CHECK_THROWS_AS(convert_row_slice(b.data(), DType::kQ8_0, 0, 33, f.data(), DType::kF32), Error);
    CHECK_THROWS_AS(convert_row_slice(b.data(), DType::kQ8_0, 0, 32, f.data(), DType::kI8), Error);

    // Plain types: f32 -> f16 / bf16 at an odd column offset.
    std::vector<float> src = {1.5f, -2.25f, 3.0e-3f, 65504.0f, -0.0f};
    std::vector<uint16_t> o(3, 0xffff);
    convert_row_slice(src.data(), DType::kF32, 1, 3, o.data(), DType::kF16);
    CHECK(o[0] == f32_to_f16(-2.25f));
    CHECK(o[1] == f32_to_f16(3.0e-3f));
    CHECK(o[2] == f32_to_f16(65504.0f));
    std::vector<uint16_t> bf = {f32_to_bf16(1.0f), f32_to_bf16(-3.5f), f32_to_bf16(7.0f)};
    std::vector<float> of(2, -1);
    convert_row_slice(bf.data(), DType::kBF16, 1, 2, of.data(), DType::kF32);
    CHECK(of == std::vector<float>{-3.5f, 7.0f});
}

TEST_CASE("gguf source: quantized slices read through TensorSource") {
    // A minimal llama file: hidden 64, 1 layer, 2 heads, ffn 96, vocab 5; matrices Q4_1 / Q8_0 / Q4_0 / F16.
    const int64_t H = 64, F = 96, V = 5;
    std::mt19937 rng(11);
    auto rand_bytes = [&](size_t n) {
        std::vector<uint8_t> v(n);
        for (auto& x : v) x = uint8_t(rng());
        return v;
    };
    // Blocks with sane scales (random f16 bits could be NaN/inf): overwrite each block's d (and m).
    auto q_tensor = [&](DType t, int64_t rows, int64_t cols) {
        int64_t bb = dtype_block_bytes(t);
        auto v = rand_bytes(size_t(rows * cols / 32 * bb));
        for (size_t o = 0; o < v.size(); o += size_t(bb)) {
            uint16_t d = f32_to_f16(0.01f + float(rng() % 100) * 1e-3f);
            std::memcpy(&v[o], &d, 2);
            if (t == DType::kQ4_1) {
                uint16_t m = f32_to_f16(-0.05f * float(rng() % 7));
                std::memcpy(&v[o + 2], &m, 2);
            }
        }
        return v;
    };
    auto f32_tensor = [&](int64_t n) {
        std::vector<uint8_t> v(size_t(n) * 4);
        for (int64_t k = 0; k < n; ++k) {
            float x = 1.0f + 0.01f * float(k);
            std::memcpy(&v[size_t(k) * 4], &x, 4);
        }
        return v;
    };
    GgufBuilder g;
    g.kv_str("general.architecture", "llama");
    g.kv_u32("llama.embedding_length", H);
    g.kv_u32("llama.feed_forward_length", F);
    g.kv_u32("llama.block_count", 1);
    g.kv_u32("llama.attention.head_count", 2);
    g.kv_u32("llama.attention.head_count_kv", 1);
    g.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
    g.kv_f32("llama.rope.freq_base", 10000.0f);
    g.kv_u32("tokenizer.ggml.bos_token_id", 3);
    g.kv_u32("tokenizer.ggml.eos_token_id", 4);
    g.tensor("token_embd.weight", 8, {uint64_t(H), uint64_t(V)}, q_tensor(DType::kQ8_0, V, H));
    g.tensor("output_norm.weight", 0, {uint64_t(H)}, f32_tensor(H));
    g.tensor("blk.0.attn_norm.weight", 0, {uint64_t(H)}, f32_tensor(H));
    g.tensor("blk.0.ffn_norm.weight", 0, {uint64_t(H)}, f32_tensor(H));
    g.tensor("blk.0.attn_q.weight", 3, {uint64_t(H), uint64_t(H)}, q_tensor(DType::kQ4_1, H, H));
    g.tensor("blk.0.attn_k.weight", 2, {uint64_t(H), 32}, q_tensor(DType::kQ4_0, 32, H));
    std::vector<uint8_t> v_bf16(size_t(32 * H * 2));
    for (size_t k = 0; k < v_bf16.size() / 2; ++k) {
        uint16_t b = f32_to_bf16(float(int(k % 97) - 48) * 0.125f);
        std::memcpy(&v_bf16[2 * k], &b, 2);
    }
    g.tensor("blk.0.attn_v.weight", 30, {uint64_t(H), 32}, v_bf16);
    g.tensor("blk.0.attn_output.weight", 8, {uint64_t(H), uint64_t(H)}, q_tensor(DType::kQ8_0, H, H));
    g.tensor("blk.0.ffn_gate.weight", 3, {uint64_t(H), uint64_t(F)}, q_tensor(DType::kQ4_1, F, H));
    g.tensor("blk.0.ffn_up.weight", 3, {uint64_t(H), uint64_t(F)}, q_tensor(DType::kQ4_1, F, H));
    g.tensor("blk.0.ffn_down.weight", 3, {uint64_t(F), uint64_t(H)}, q_tensor(DType::kQ4_1, H, F));
    g.tensor("rope_freqs.weight", 0, {16}, f32_tensor(16));
    auto bytes = g.build();
    std::string path = std::string(LATTICE_BINARY_DIR) + "/test_gguf_quant_source.gguf";
    {
        std::FILE* fp = std::fopen(path.c_str(), "wb");
        REQUIRE(fp);
        REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), fp) == bytes.size());
        std::fclose(fp);
    }
    auto src = open_gguf_model(path);
    const ModelConfig& c = src->config();
    CHECK(c.hidden == H);
    CHECK(c.intermediate == F);
    CHECK(c.n_heads == 2);
    CHECK(c.n_kv_heads == 1);
    CHECK(c.head_dim == 32);
    CHECK(c.vocab == V);
    CHECK(c.tie_embeddings);
    CHECK(c.bos_id == 3);
    CHECK(c.eos_ids == std::vector<int64_t>{4});
    CHECK(c.rms_eps == 1e-6);
    CHECK(src->rope_freq_factors().size() == 16);
    CHECK(src->rope_freq_factors()[3] == 1.0f + 0.01f * 3.0f);
    CHECK_FALSE(src->has("lm_head.weight"));
    CHECK_FALSE(src->has("rope_freqs.weight"));

    const TensorInfo& q = src->info("model.layers.0.self_attn.q_proj.weight");
    CHECK(q.dtype == DType::kQ4_1);
    CHECK(q.shape == std::vector<int64_t>{H, H});
    const TensorInfo& down = src->info("model.layers.0.mlp.down_proj.weight");
    CHECK(down.shape == std::vector<int64_t>{H, F});

    // Rows [5, 8) x cols [32, 96) of down_proj: compare with an independent dequant of those blocks.
    const GgufTensor* raw = nullptr;
    auto gf = GgufFile::open(path);
    raw = &gf->tensor("blk.0.ffn_down.weight");
    const int64_t row_bytes = F / 32 * 20;
    std::vector<float> out(3 * 64, -999.0f);
    src->read(down.name, 5, 3, 32, 64, DType::kF32, out.data());
    for (int64_t r = 0; r < 3; ++r)
        for (int64_t k = 0; k < 64; ++k) {
            int64_t col = 32 + k;
            const uint8_t* blk = gf->tensor_data(*raw) + (5 + r) * row_bytes + col / 32 * 20;
            uint16_t dh, mh;
            std::memcpy(&dh, blk, 2);
            std::memcpy(&mh, blk + 2, 2);
            int e = int(col % 32);
            int nib = e < 16 ? (blk[4 + e] & 15) : (blk[4 + e - 16] >> 4);
            float want = float(nib) * f16_to_f32(dh) + f16_to_f32(mh);
            REQUIRE(out[size_t(r * 64 + k)] == want);
        }
    // bf16 output of an embedding row (Q8_0).
    std::vector<uint16_t> e16(H, 0xffff);
    src->read("model.embed_tokens.weight", 4, 1, 0, H, DType::kBF16, e16.data());
    std::vector<float> e32(H);
    src->read("model.embed_tokens.weight", 4, 1, 0, H, DType::kF32, e32.data());
    for (int64_t k = 0; k < H; ++k) CHECK(e16[size_t(k)] == f32_to_bf16(e32[size_t(k)]));
    // BF16 v_proj: rows [7, 9), cols [3, 50) (plain types need no alignment), as f32 and as f16.
    CHECK(src->info("model.layers.0.self_attn.v_proj.weight").dtype == DType::kBF16);
    std::vector<float> vf(2 * 47, -999.0f);
    src->read("model.layers.0.self_attn.v_proj.weight", 7, 2, 3, 47, DType::kF32, vf.data());
    std::vector<uint16_t> vh(2 * 47, 0xffff);
    src->read("model.layers.0.self_attn.v_proj.weight", 7, 2, 3, 47, DType::kF16, vh.data());
    for (int64_t r = 0; r < 2; ++r)
        for (int64_t k = 0; k < 47; ++k) {
            size_t idx = size_t((7 + r) * H + 3 + k);
            float want = float(int(idx % 97) - 48) * 0.125f;
            CHECK(vf[size_t(r * 47 + k)] == want);
            CHECK(vh[size_t(r * 47 + k)] == f32_to_f16(want));
        }
    // Norms (F32, 1-D) as a single row.
    std::vector<float> n(H);
    src->read("model.norm.weight", 0, 1, 0, H, DType::kF32, n.data());
    CHECK(n[10] == 1.0f + 0.01f * 10.0f);

    CHECK_THROWS_AS(src->read(down.name, 0, 1, 16, 32, DType::kF32, out.data()), Error);  // not block aligned
    CHECK_THROWS_AS(src->read(down.name, 62, 3, 0, 32, DType::kF32, out.data()), Error);  // rows past the end
    CHECK_THROWS_AS(src->read(down.name, 0, 1, 64, 64, DType::kF32, out.data()), Error);  // cols past the end
    CHECK_THROWS_AS(src->info("model.layers.1.mlp.up_proj.weight"), Error);
    CHECK(src->total_bytes() > 0);
    std::remove(path.c_str());
}

TEST_CASE("gguf source: missing or misshapen tensors are named") {
    GgufBuilder g;
    g.kv_str("general.architecture", "llama");
    g.kv_u32("llama.embedding_length", 32);
    g.kv_u32("llama.feed_forward_length", 32);
    g.kv_u32("llama.block_count", 1);
    g.kv_u32("llama.attention.head_count", 1);
    g.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    std::vector<uint8_t> z(32 * 4 * 4, 0);
    g.tensor("token_embd.weight", 0, {32, 4}, z);
    auto bytes = g.build();
    std::string path = std::string(LATTICE_BINARY_DIR) + "/test_gguf_incomplete.gguf";
    std::FILE* fp = std::fopen(path.c_str(), "wb");
    REQUIRE(fp);
    std::fwrite(bytes.data(), 1, bytes.size(), fp);
    std::fclose(fp);
    try {
        open_gguf_model(path);
        FAIL("expected an error");
    } catch (const Error& e) {
        std::string m = e.what();
        CHECK_MESSAGE(m.find("model.norm.weight") != std::string::npos, m);
        CHECK_MESSAGE(m.find(path) != std::string::npos, m);
    }
    std::remove(path.c_str());
}
