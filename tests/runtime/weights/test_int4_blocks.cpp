// GGUF 4-bit blocks kept as they are: GgufSource::read_int4 (then the kernels' packed layout read back) gives
// exactly gguf-py's dequantization of Q4_0 / Q4_1 blocks (data/q4_blocks.gguf, written by
// data/make_q4_fixtures.py with gguf-py: random block bytes, corner scales), and so does the f32 read; a row /
// column slice's 4-bit read (q/k rows un-permuted like the float read) equals the float read of the slice; a
// wrong block type or a non-finite scale is refused with the tensor named.
#include <doctest/doctest.h>

// GCC 12 reports a false -Wstringop-overflow inside std::vector::insert when GgufBuilder::build is inlined here.
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/int4_gemm.h"
#include "runtime/weights/dequant.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/tensor_source.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/runtime/weights/q4_gguf.h"

using namespace lattice;

namespace {

int64_t first_difference(const float* a, const float* b, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (std::memcmp(a + i, b + i, 4) != 0) return i;
    return -1;
}

}  // namespace

TEST_CASE("gguf-py fixture: lattice's 4-bit reads and f32 reads of Q4_0 / Q4_1 equal gguf-py's values bit for bit") {
    const std::string path = std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/weights/data/q4_blocks.gguf";
    auto src = open_gguf_model(path);
    auto f = GgufFile::open(path);  // the expected tensors, which the model source does not map
    const int64_t hd = src->config().head_dim;
    const std::pair<const char*, const char*> linears[] = {
        {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"}, {"attn_v", "self_attn.v_proj"},
        {"attn_output", "self_attn.o_proj"}, {"ffn_gate", "mlp.gate_proj"},  {"ffn_up", "mlp.up_proj"},
        {"ffn_down", "mlp.down_proj"}};
    double biggest = 0;
    for (const auto& [gguf_name_, hf] : linears) {
        const char* gguf_name = gguf_name_;  // (a structured binding cannot be captured in clang 14)
        CAPTURE(gguf_name);
        const std::string name = std::string("model.layers.0.") + hf + ".weight";
        const GgufTensor& e = f->tensor(std::string("blk.0.") + gguf_name + ".weight.expected");
        REQUIRE(e.dtype == DType::kF32);
        const int64_t rows = e.ne[1], cols = e.ne[0];
        std::vector<float> file_order(size_t(rows * cols)), want(file_order.size());
        std::memcpy(file_order.data(), f->tensor_data(e), file_order.size() * 4);
        // llama.cpp's converter stores q/k rows of each head in pair order: GGUF row 2i + j is HF row j * hd/2 + i.
        const bool qk = std::string(gguf_name) == "attn_q" || std::string(gguf_name) == "attn_k";
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t h = r / hd, i = r % hd, to = qk ? h * hd + (i % 2) * (hd / 2) + i / 2 : r;
            std::memcpy(&want[size_t(to * cols)], &file_order[size_t(r * cols)], size_t(cols) * 4);
        }
        for (float v : want) biggest = std::max(biggest, double(std::fabs(v)));
        const TensorInfo& ti = src->info(name);
        CHECK(ti.int4_group == 32);
        CHECK(ti.int4_kind == (ti.dtype == DType::kQ4_0 ? Int4Kind::kOffset8 : Int4Kind::kAffine));
        const Int4Weights w = src->read_int4(name, 0, rows, 0, cols);
        for (IsaLevel isa : test::supported_isas()) {
            CAPTURE(isa_name(isa));
            const PackedInt4 p = pack_int4_weights(w.matrix(), isa);
            std::vector<float> got(want.size(), -1.0f);
            dequantize_packed_int4(p, got.data());
            CHECK(first_difference(got.data(), want.data(), rows * cols) == -1);
        }
        std::vector<float> f32(want.size(), -1.0f);
        src->read(name, 0, rows, 0, cols, DType::kF32, f32.data());
        CHECK(first_difference(f32.data(), want.data(), rows * cols) == -1);
    }
    CHECK(biggest > 1e5);  // the corner scales (65504) are in the file
}

TEST_CASE("gguf source: the 4-bit read of a slice equals the float read of the same slice") {
    const std::string path = test::write_file(std::string(LATTICE_BINARY_DIR) + "/test_int4_blocks.gguf",
                                              test::q4_llama_gguf(test::Q4Types{}));
    auto src = open_gguf_model(path);
    const int64_t H = test::kQ4H, F = test::kQ4F;
    struct Slice {
        const char* name;
        int64_t row0, rows, col0, cols;
    };
    // q_proj (rows un-permuted per head), o_proj's second head's columns, down_proj's rows 5..7, columns 32..95.
    for (const Slice& s : {Slice{"model.layers.0.self_attn.q_proj.weight", 0, H, 0, H},
                           Slice{"model.layers.0.self_attn.o_proj.weight", 0, H, 32, 32},
                           Slice{"model.layers.0.mlp.down_proj.weight", 5, 3, 32, 64}}) {
        CAPTURE(s.name);
        const DType t = src->info(s.name).dtype;
        REQUIRE((t == DType::kQ4_0 || t == DType::kQ4_1));
        std::vector<float> f32(size_t(s.rows * s.cols));
        src->read(s.name, s.row0, s.rows, s.col0, s.cols, DType::kF32, f32.data());
        const Int4Weights w = src->read_int4(s.name, s.row0, s.rows, s.col0, s.cols);
        int64_t bad = 0;
        for (int64_t r = 0; r < s.rows; ++r)
            for (int64_t c = 0; c < s.cols; ++c) {
                const float v = int4_value(w.matrix(), r, c);
                bad += std::memcmp(&v, &f32[size_t(r * s.cols + c)], 4) != 0;
            }
        CHECK(bad == 0);
    }
    std::vector<uint8_t> buf(size_t(dtype_bytes(DType::kQ4_1, F * H)));
    CHECK_THROWS_WITH_AS(src->read("model.layers.0.mlp.down_proj.weight", 0, H, 0, F, DType::kQ4_1, buf.data()),
                         doctest::Contains("or its own block type"), Error);
    CHECK_THROWS_WITH_AS(src->read("model.layers.0.mlp.down_proj.weight", 0, H, 16, 32, DType::kQ4_0, buf.data()),
                         doctest::Contains("32-aligned"), Error);
}

TEST_CASE("gguf source: a 4-bit block with a non-finite scale is refused, naming the tensor and the row") {
    // blk.0.ffn_up.weight (Q4_1, 2 blocks per row): row 7's second block (columns 32..63) gets an f16 infinity.
    const std::vector<uint8_t> bytes =
        test::q4_llama_gguf(test::Q4Types{}, 11, [](const std::string& name, std::vector<uint8_t>& data) {
            if (name != "blk.0.ffn_up.weight") return;
            const uint16_t inf = 0x7C00;
            std::memcpy(data.data() + (7 * 2 + 1) * 20, &inf, 2);
        });
    auto src = open_gguf_model(test::write_file(std::string(LATTICE_BINARY_DIR) + "/test_int4_bad_scale.gguf", bytes));
    CHECK_THROWS_WITH_AS(src->read_int4("model.layers.0.mlp.up_proj.weight", 0, test::kQ4F, 0, test::kQ4H),
                         doctest::Contains("blk.0.ffn_up.weight\" (q4_1): block of row 7 columns [32, 64)"), Error);
    // Other rows still read; the float read of the row names the tensor too.
    CHECK(src->read_int4("model.layers.0.mlp.up_proj.weight", 0, 7, 0, test::kQ4H).n == 7);
    std::vector<float> f32(static_cast<size_t>(test::kQ4H));
    CHECK_THROWS_WITH_AS(src->read("model.layers.0.mlp.up_proj.weight", 7, 1, 0, test::kQ4H, DType::kF32, f32.data()),
                         doctest::Contains("blk.0.ffn_up.weight"), Error);
}
