// GGUF K-quants (and Q5_0 / Q5_1): lattice's f32 reads equal gguf-py's dequantization bit for bit
// (data/kquant_blocks.gguf, written by data/make_kquant_fixtures.py: random block bytes, corner f16 scales); Q4_K
// kept in 4 bits (GgufSource::read_int4, q4_k_to_int4) is within the f16 rounding of d * sc and dmin * mn of
// gguf-py's values, and equal where those are f16 (power-of-two scales); a scale beyond f16 is refused; slices
// must keep whole 256-element super-blocks; a non-finite super-block scale is refused naming the tensor. The
// kernels' K-quant layout (Q4_K / Q6_K at the file's bytes, kernels/cpu/int4_gemm.h) dequantizes to gguf-py's
// values bit for bit (corner scales too), and its W4A8 GEMM on every ISA equals the scalar reference bit for bit
// and a double sum over those values within int4_gemm.h's bound.
#include <doctest/doctest.h>

// GCC 12 reports a false -Wstringop-overflow inside std::vector::insert when GgufBuilder::build is inlined here.
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/quantize.h"
#include "kernels/cpu/int4_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/weights/dequant.h"
#include "runtime/weights/gguf.h"
#include "runtime/weights/tensor_source.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/runtime/weights/kquant_gguf.h"
#include "tests/runtime/weights/q4_gguf.h"

using namespace lattice;

namespace {

const std::string kFixture = std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/weights/data/kquant_blocks.gguf";

int64_t first_difference(const float* a, const float* b, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (std::memcmp(a + i, b + i, 4) != 0) return i;
    return -1;
}

// "<gguf name>.expected" in HF row order (llama.cpp's converter stores attn_q / attn_k rows of each head in pair
// order: GGUF row 2i + j is HF row j * hd/2 + i).
std::vector<float> expected(const GgufFile& f, const std::string& gguf_name, int64_t hd, bool qk) {
    const GgufTensor& e = f.tensor(gguf_name + ".expected");
    REQUIRE(e.dtype == DType::kF32);
    const int64_t rows = e.ne.size() > 1 ? e.ne[1] : 1, cols = e.ne[0];
    std::vector<float> file_order(size_t(rows * cols)), want(file_order.size());
    std::memcpy(file_order.data(), f.tensor_data(e), file_order.size() * 4);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = r / hd, i = r % hd, to = qk ? h * hd + (i % 2) * (hd / 2) + i / 2 : r;
        std::memcpy(&want[size_t(to * cols)], &file_order[size_t(r * cols)], size_t(cols) * 4);
    }
    return want;
}

struct Mapped {
    const char* gguf;
    const char* hf;
    DType type;
};
constexpr Mapped kMapped[] = {
    {"token_embd.weight", "model.embed_tokens.weight", DType::kQ4_K},
    {"output.weight", "lm_head.weight", DType::kQ6_K},
    {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", DType::kQ4_K},
    {"blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", DType::kQ5_K},
    {"blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", DType::kQ6_K},
    {"blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight", DType::kQ4_K},
    {"blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", DType::kQ4_K},
};

// |4-bit value - gguf-py's| may reach half an f16 ulp of d * sc (times q <= 15) and of dmin * mn (2^-11
// relative; 2^-25 absolute below f16's normal range), plus the f32 rounding of either side.
double repack_bound(float d16, float m16, float got, float want) {
    return std::ldexp(1.001 * (15 * std::fabs(double(d16)) + std::fabs(double(m16))), -11) +
           std::ldexp(std::max(std::fabs(double(got)), std::fabs(double(want))), -23) + std::ldexp(1.0, -21);
}

}  // namespace

TEST_CASE("gguf-py fixture: f32 reads of Q4_K / Q5_K / Q6_K / Q5_0 / Q5_1 equal gguf-py's values bit for bit") {
    auto src = open_gguf_model(kFixture);
    auto f = GgufFile::open(kFixture);  // the expected and corner tensors, which the model source does not map
    const int64_t hd = src->config().head_dim;
    CHECK(hd == 16);
    for (const Mapped& m : kMapped) {
        CAPTURE(m.gguf);
        const TensorInfo& ti = src->info(m.hf);
        CHECK(ti.dtype == m.type);
        CHECK(ti.int4_group == (m.type == DType::kQ4_K ? 32 : 0));
        const std::string g = m.gguf;
        const std::vector<float> want = expected(*f, g, hd, g == "blk.0.attn_q.weight" || g == "blk.0.attn_k.weight");
        const int64_t rows = ti.rows(), cols = ti.cols();
        REQUIRE(int64_t(want.size()) == rows * cols);
        std::vector<float> got(want.size(), -1.0f);
        src->read(m.hf, 0, rows, 0, cols, DType::kF32, got.data());
        CHECK(first_difference(got.data(), want.data(), rows * cols) == -1);
        // f16 / bf16 reads round those values once.
        std::vector<uint16_t> h(want.size()), b(want.size());
        src->read(m.hf, 0, rows, 0, cols, DType::kF16, h.data());
        src->read(m.hf, 0, rows, 0, cols, DType::kBF16, b.data());
        int64_t bad = 0;
        for (size_t i = 0; i < want.size(); ++i) bad += h[i] != f32_to_f16(want[i]) || b[i] != f32_to_bf16(want[i]);
        CHECK(bad == 0);
    }
    // Corner scales (f16 extremes, subnormals, -0.0, random bits) through convert_row_slice, row by row.
    double biggest = 0;
    for (const char* name : {"corner.q4_K", "corner.q5_K", "corner.q6_K", "corner.q5_0", "corner.q5_1"}) {
        CAPTURE(name);
        const GgufTensor& t = f->tensor(name);
        const std::vector<float> want = expected(*f, name, hd, false);
        const int64_t rows = t.ne[1], cols = t.ne[0], row_bytes = dtype_bytes(t.dtype, cols);
        std::vector<float> got(want.size(), -1.0f);
        for (int64_t r = 0; r < rows; ++r)
            convert_row_slice(f->tensor_data(t) + r * row_bytes, t.dtype, 0, cols, got.data() + r * cols, DType::kF32);
        CHECK(first_difference(got.data(), want.data(), rows * cols) == -1);
        CHECK(first_non_finite_block(f->tensor_data(t), t.dtype, rows * cols / dtype_block_elems(t.dtype)) == -1);
        for (float v : want) biggest = std::max(biggest, double(std::fabs(v)));
        // A slice from the second block on: the block offsets follow the type's block size.
        const int64_t be = dtype_block_elems(t.dtype);
        convert_row_slice(f->tensor_data(t), t.dtype, be, cols - be, got.data(), DType::kF32);
        CHECK(first_difference(got.data(), want.data() + be, cols - be) == -1);
        CHECK_THROWS_WITH_AS(convert_row_slice(f->tensor_data(t), t.dtype, be / 2, be, got.data(), DType::kF32),
                             doctest::Contains((std::to_string(be) + "-element blocks").c_str()), Error);
    }
    CHECK(biggest > 1e7);  // d = 65504 times a large scale and quant is in the corners
}

TEST_CASE("gguf source: Q4_K read in 4 bits is gguf-py's values to within the f16 rounding of its scales") {
    auto src = open_gguf_model(kFixture);
    auto f = GgufFile::open(kFixture);
    const int64_t hd = src->config().head_dim;
    int64_t exact_groups = 0, rounded_elems = 0;
    for (const Mapped& m : kMapped) {
        if (m.type != DType::kQ4_K) continue;
        CAPTURE(m.gguf);
        const std::string g = m.gguf;
        const std::vector<float> want = expected(*f, g, hd, g == "blk.0.attn_q.weight");
        const TensorInfo& ti = src->info(m.hf);
        CHECK(ti.int4_kind == Int4Kind::kAffine);
        const int64_t rows = ti.rows(), cols = ti.cols();
        const Int4Weights w = src->read_int4(m.hf, 0, rows, 0, cols);
        REQUIRE((w.n == rows && w.k == cols && w.group == 32 && w.kind == Int4Kind::kAffine));
        int64_t over = 0, inexact_pow2 = 0;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
                const float got = int4_value(w.matrix(), r, c), ref = want[size_t(r * cols + c)];
                const int64_t gi = r * (cols / 32) + c / 32;
                const float d16 = f16_to_f32(w.d[size_t(gi)]), m16 = f16_to_f32(w.m[size_t(gi)]);
                over += std::fabs(double(got) - double(ref)) > repack_bound(d16, m16, got, ref);
                rounded_elems += std::memcmp(&got, &ref, 4) != 0;
                // Sub-block 0 of each super-block has a power-of-two scale and a zero or power-of-two minimum.
                if (c % 256 < 32) inexact_pow2 += std::memcmp(&got, &ref, 4) != 0;
            }
        exact_groups += rows * (cols / 256);
        CHECK(over == 0);
        CHECK(inexact_pow2 == 0);
        // The packed layouts of the kernels hold the same values.
        for (IsaLevel isa : test::supported_isas()) {
            CAPTURE(isa_name(isa));
            const PackedInt4 p = pack_int4_weights(w.matrix(), isa);
            std::vector<float> packed(want.size(), -1.0f), plain(want.size());
            dequantize_packed_int4(p, packed.data());
            dequantize_int4(w.matrix(), plain.data());
            CHECK(first_difference(packed.data(), plain.data(), rows * cols) == -1);
        }
    }
    CHECK(exact_groups >= 100);
    CHECK(rounded_elems > 1000);  // the rounding is real elsewhere (the bound, not equality, is what holds)
    // Rows of whole heads of q_proj (rows un-permuted like the float read) equal the full read's rows.
    const char* q = "model.layers.0.self_attn.q_proj.weight";
    const Int4Weights all = src->read_int4(q, 0, 32, 0, 256), part = src->read_int4(q, 16, 16, 0, 256);
    CHECK(std::equal(part.qs.begin(), part.qs.end(), all.qs.begin() + 16 * 128));
    CHECK(std::equal(part.d.begin(), part.d.end(), all.d.begin() + 16 * 8));
    CHECK(std::equal(part.m.begin(), part.m.end(), all.m.begin() + 16 * 8));
    CHECK_THROWS_WITH_AS(src->read_int4(q, 0, 16, 0, 128), doctest::Contains("must be 256-aligned"), Error);
    std::vector<float> buf(256);
    CHECK_THROWS_WITH_AS(src->read(q, 0, 1, 32, 32, DType::kF32, buf.data()),
                         doctest::Contains("q4_K: column slice [32, +32) must be 256-aligned"), Error);
}

TEST_CASE("q4_k_to_int4 on corner scales: within the bound where d * sc and dmin * mn fit f16, else refused") {
    auto f = GgufFile::open(kFixture);
    const GgufTensor& t = f->tensor("corner.q4_K");
    const std::vector<float> want = expected(*f, "corner.q4_K", 1, false);
    const int64_t n_super = t.numel() / 256;
    int64_t refused = 0, kept = 0;
    for (int64_t b = 0; b < n_super; ++b) {
        CAPTURE(b);
        const uint8_t* blk = f->tensor_data(t) + b * 144;
        Int4Weights w(1, 256, 32, Int4Kind::kAffine);
        const int64_t g = q4_k_to_int4(blk, 256, w.qs.data(), w.d.data(), w.m.data());
        uint16_t dh = 0, mh = 0;
        std::memcpy(&dh, blk, 2);
        std::memcpy(&mh, blk + 2, 2);
        const float* ref = want.data() + b * 256;
        if (g >= 0) {
            // Only a super-block scale or minimum near f16's top can overflow (times a 6-bit scale <= 63).
            CHECK((std::fabs(f16_to_f32(dh)) * 63 > 65504 || std::fabs(f16_to_f32(mh)) * 63 > 65504));
            ++refused;
            continue;
        }
        ++kept;
        int64_t over = 0;
        for (int64_t c = 0; c < 256; ++c) {
            const float got = int4_value(w.matrix(), 0, c);
            over += std::fabs(double(got) - double(ref[c])) >
                    repack_bound(f16_to_f32(w.d[size_t(c / 32)]), f16_to_f32(w.m[size_t(c / 32)]), got, ref[c]);
        }
        CHECK(over == 0);
    }
    // Refused: d = +-65504 (super-blocks 0, 1) and dmin = +-65504 (4, 5) beside random 6-bit scales; kept: a
    // subnormal or -0.0 minimum beside a small d (6, 7), and some of the random-bit ones.
    CHECK(refused >= 4);
    CHECK(kept >= 3);
}

TEST_CASE("gguf source: a K-quant super-block with a non-finite scale is refused, naming the tensor and the row") {
    // blk.0.ffn_up.weight (Q4_K, one super-block per row): row 3's dmin; blk.0.ffn_down.weight (Q6_K): row 5's d.
    const std::vector<uint8_t> bytes =
        test::kquant_llama_gguf(test::KTypes{}, 5, [](const std::string& name, std::vector<uint8_t>& data) {
            const uint16_t inf = 0x7C00, nan = 0x7E00;
            if (name == "blk.0.ffn_up.weight") std::memcpy(data.data() + 3 * 144 + 2, &inf, 2);
            if (name == "blk.0.ffn_down.weight") std::memcpy(data.data() + 5 * 210 + 208, &nan, 2);
        });
    auto src = open_gguf_model(test::write_file(std::string(LATTICE_BINARY_DIR) + "/test_kquant_bad.gguf", bytes));
    CHECK_THROWS_WITH_AS(src->read_int4("model.layers.0.mlp.up_proj.weight", 0, test::kKF, 0, test::kKH),
                         doctest::Contains("blk.0.ffn_up.weight\" (q4_K): block of row 3 columns [0, 256)"), Error);
    CHECK(src->read_int4("model.layers.0.mlp.up_proj.weight", 0, 3, 0, test::kKH).n == 3);
    std::vector<float> row(static_cast<size_t>(test::kKF));
    CHECK_THROWS_WITH_AS(src->read("model.layers.0.mlp.down_proj.weight", 5, 1, 0, test::kKF, DType::kF32, row.data()),
                         doctest::Contains("blk.0.ffn_down.weight"), Error);
    src->read("model.layers.0.mlp.down_proj.weight", 4, 1, 0, test::kKF, DType::kF32, row.data());  // others read
    CHECK(std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); }));
}

namespace {

// 4-bit group form of [n, k] (zeros: the K-quant layout does not read it) with K-quant parts beside.
Int4Weights with_parts(int64_t k, std::vector<Int4KQuantPart> parts) {
    int64_t n = 0;
    for (const Int4KQuantPart& p : parts) n += p.rows;
    Int4Weights w(n, k, 32, Int4Kind::kAffine);
    w.kq = std::move(parts);
    return w;
}

// The parts dequantized by dequant.h (gguf-py's values, the test above), rows in order.
std::vector<float> parts_values(const Int4Weights& w) {
    std::vector<float> out(size_t(w.n * w.k));
    int64_t row = 0;
    for (const Int4KQuantPart& p : w.kq) {
        dequant_blocks(p.type, p.blocks.data(), out.data() + row * w.k, p.rows * w.k);
        row += p.rows;
    }
    return out;
}

bool kq_isa(IsaLevel isa) {
    return vector_level(isa) == IsaLevel::kScalar || vector_level(isa) == IsaLevel::kAvx512Vnni;
}

}  // namespace

TEST_CASE("K-quant layout: Q4_K and Q6_K packed at the file's bytes dequantize to gguf-py's values bit for bit") {
    auto src = open_gguf_model(kFixture);
    auto f = GgufFile::open(kFixture);
    const int64_t hd = src->config().head_dim;
    for (const Mapped& m : kMapped) {
        if (m.type != DType::kQ4_K && m.type != DType::kQ6_K) continue;
        CAPTURE(m.gguf);
        const std::string g = m.gguf;
        const std::vector<float> want = expected(*f, g, hd, g == "blk.0.attn_q.weight");
        const TensorInfo& ti = src->info(m.hf);
        CHECK(ti.int4_requant == (m.type == DType::kQ6_K));
        const Int4Weights w = src->read_int4(m.hf, 0, ti.rows(), 0, ti.cols());
        REQUIRE(w.kq.size() == 1);
        CHECK(w.kq[0].type == m.type);
        for (IsaLevel isa : test::supported_isas()) {
            CAPTURE(isa_name(isa));
            const PackedInt4 p = pack_int4_weights(w.matrix(), isa, true);
            CHECK(p.kq == kq_isa(isa));
            if (!p.kq) continue;
            // The file's bytes per super-block and channel (Q6_K: + 2 of alignment), channels padded to 16.
            CHECK(p.bytes() == (w.n + 15) / 16 * (w.k / 256) * (m.type == DType::kQ4_K ? kKqQ4Bytes : kKqQ6Bytes));
            std::vector<float> got(want.size(), -1.0f);
            dequantize_packed_int4(p, got.data());
            CHECK(first_difference(got.data(), want.data(), int64_t(want.size())) == -1);
        }
    }
    // The corner scales (f16 extremes, subnormals, -0.0) through the layout, as the f32 read gives them.
    for (const char* name : {"corner.q4_K", "corner.q6_K"}) {
        CAPTURE(name);
        const GgufTensor& t = f->tensor(name);
        const int64_t rows = t.ne[1], cols = t.ne[0];
        const uint8_t* data = f->tensor_data(t);
        const std::vector<uint8_t> bytes(data, data + dtype_bytes(t.dtype, rows * cols));
        const Int4Weights w = with_parts(cols, {Int4KQuantPart{t.dtype, rows, bytes}});
        const std::vector<float> want = parts_values(w);
        const PackedInt4 p = pack_int4_weights(w.matrix(), IsaLevel::kScalar, true);
        REQUIRE(p.kq);
        std::vector<float> got(want.size(), -1.0f);
        dequantize_packed_int4(p, got.data());
        CHECK(first_difference(got.data(), want.data(), rows * cols) == -1);
    }
}

TEST_CASE("w4a8 on the K-quant layout: AVX-512 equals the scalar reference bit for bit, both the double sum's value") {
    std::mt19937 rng(11);
    const int64_t k = 512;
    // Q4_K | Q6_K | Q4_K rows as a fused q | k | v with a Q6_K part; the last part fills half a panel.
    auto part = [&](DType t, int64_t rows) { return Int4KQuantPart{t, rows, test::k_tensor_bytes(t, rows, k, rng)}; };
    const Int4Weights w = with_parts(k, {part(DType::kQ4_K, 32), part(DType::kQ6_K, 16), part(DType::kQ4_K, 8)});
    const std::vector<float> wv = parts_values(w);
    const PackedInt4 ref = pack_int4_weights(w.matrix(), IsaLevel::kScalar, true);
    REQUIRE(ref.kq);
    CHECK(ref.bytes() == 3 * 2 * kKqQ4Bytes + 1 * 2 * kKqQ6Bytes);  // 3 Q4_K panels, 1 Q6_K, 2 super-blocks
    ThreadPool pool(2, false), one(1, false);  // one thread: a call gets all panels (the prefill tile's pairs)
    for (int64_t m : {1, 2, 5, 9}) {
        CAPTURE(m);
        std::vector<float> x(size_t(m * k));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : x) v = nd(rng);
        x[3] = 40.0f;  // an outlier channel: its group's scale only
        std::vector<float> y_ref(size_t(m * w.n), -1.0f);
        gemm_w4a8(x.data(), m, k, ref, y_ref.data(), pool);
        // The double sum over gguf-py's values and the int8 activations of each group of 32 (quantize_row_int8).
        int64_t over = 0;
        for (int64_t r = 0; r < m; ++r) {
            std::vector<int8_t> q(static_cast<size_t>(k));
            std::vector<float> s(static_cast<size_t>(k / 32));
            for (int64_t g = 0; g < k / 32; ++g)
                s[size_t(g)] = quantize_row_int8(&x[size_t(r * k + g * 32)], 32, &q[size_t(g * 32)]);
            for (int64_t c = 0; c < w.n; ++c) {
                double sum = 0, mag = 0;
                for (int64_t i = 0; i < k; ++i) {
                    const double t = double(wv[size_t(c * k + i)]) * double(q[size_t(i)]) * double(s[size_t(i / 32)]);
                    sum += t;
                    mag += std::fabs(t);
                }
                // int4_gemm.h: within (2 groups + 2) units of roundoff of the terms (16 groups here).
                over += std::fabs(double(y_ref[size_t(r * w.n + c)]) - sum) > std::ldexp(2.0 * 16 + 4, -24) * mag;
            }
        }
        CHECK(over == 0);
        for (IsaLevel isa : test::supported_isas()) {
            if (!kq_isa(isa) || isa == IsaLevel::kScalar) continue;
            CAPTURE(isa_name(isa));
            const PackedInt4 p = pack_int4_weights(w.matrix(), isa, true);
            REQUIRE(p.kq);
            for (ThreadPool* tp : {&pool, &one}) {
                std::vector<float> y(y_ref.size(), -2.0f);
                gemm_w4a8(x.data(), m, k, p, y.data(), *tp);
                CHECK(first_difference(y.data(), y_ref.data(), int64_t(y.size())) == -1);
            }
        }
    }
    // W4A16 has no K-quant kernels: such a linear packs the group form; a part that splits a panel, too.
    CHECK_FALSE(pack_int4_weights(w.matrix(), IsaLevel::kScalar, false).kq);
    const Int4Weights odd = with_parts(k, {part(DType::kQ4_K, 8), part(DType::kQ6_K, 8)});
    CHECK_FALSE(pack_int4_weights(odd.matrix(), IsaLevel::kScalar, true).kq);
}
