// GGUF K-quant checkpoints in a 4-bit run (tests/runtime/weights/kquant_gguf.h: Q4_K / Q5_K / Q6_K linears mixed
// as llama.cpp's Q4_K_M mixes them): the plan reads Q4_K and Q6_K linears (fused ones mixed too) and a tied Q4_K
// embedding's LM head in their 4-bit form with their super-blocks beside (the CPU's W4A8 keeps those, Q6_K at 6
// bits); a tp split through a
// 256-element super-block is refused naming the tensor; --quant auto picks 4-bit when most linear weights are
// 4-bit; an all-Q4_K model's W4A16 logits equal its f32 read to within the repack's f16 rounding of the scales,
// and the gguf-py fixture model (data/kquant_blocks.gguf) runs in W4A8 within the 4-bit GGUF tolerance; the
// memory estimates (RankWeights::resident_bytes, the planner's int4_bytes) count the bytes a loaded model holds.
#include <doctest/doctest.h>

// GCC 12 reports a false -Wstringop-overflow inside std::vector::insert when GgufBuilder::build is inlined here.
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <cmath>
#include <string>

#include "kernels/cpu/int4_gemm.h"
#include "parallel/plan_model.h"
#include "runtime/builder/build.h"
#include "runtime/builder/estimate.h"
#include "runtime/model/rank_weights.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/model/quant_test_util.h"
#include "tests/runtime/weights/kquant_gguf.h"
#include "tests/runtime/weights/q4_gguf.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_kquant_gguf {

using namespace lattice;
using namespace lattice::testing;

namespace {

std::string k_file(const test::KTypes& ty, const char* name) {
    return test::write_file(std::string(LATTICE_BINARY_DIR) + "/" + name, test::kquant_llama_gguf(ty));
}

const RankTensor& find(const RankWeights& rw, WeightRole role) {
    for (const RankTensor& t : rw.tensors())
        if (t.role == role) return t;
    FAIL("no tensor of role " << int(role));
    return rw.tensors().front();
}

test::KTypes all(DType t) {
    test::KTypes ty;
    ty.embed = ty.q = ty.k = ty.v = ty.o = ty.gate = ty.up = ty.down = t;
    return ty;
}

// The fixture's model tensors only: its "<name>.expected" and "corner.*" tensors (the reference values the read
// tests use) are hidden from check_tensor_set, which would refuse them as unused.
class ModelTensorsOnly final : public TensorSource {
public:
    explicit ModelTensorsOnly(std::unique_ptr<TensorSource> inner) : inner_(std::move(inner)) {}
    const ModelConfig& config() const override { return inner_->config(); }
    bool has(const std::string& n) const override { return inner_->has(n); }
    const TensorInfo& info(const std::string& n) const override { return inner_->info(n); }
    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out,
              void* dst) const override {
        inner_->read(name, row0, rows, col0, cols, out, dst);
    }
    Int4Weights read_int4(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                          int64_t cols) const override {
        return inner_->read_int4(name, row0, rows, col0, cols);
    }
    Int4Weights read_kquant(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                            int64_t cols) const override {
        return inner_->read_kquant(name, row0, rows, col0, cols);
    }
    std::vector<std::string> tensor_names() const override {
        std::vector<std::string> out;
        for (std::string& n : inner_->tensor_names())
            if (!n.ends_with(".expected") && !n.starts_with("corner.")) out.push_back(std::move(n));
        return out;
    }
    std::string describe() const override { return inner_->describe(); }
    int64_t total_bytes() const override { return inner_->total_bytes(); }

private:
    std::unique_ptr<TensorSource> inner_;
};

}  // namespace

TEST_CASE("K-quant GGUF: the plan reads Q4_K and Q6_K linears (q|k|v mixed) in their 4-bit form, super-blocks kept") {
    auto src = open_model(k_file(test::KTypes{}, "test_kquant_plan.gguf"));
    ModelOptions o;
    o.quant = QuantMode::kW4A8;
    o.quant_head = true;
    {
        RankWeights rw(*src, o);
        for (WeightRole role : {WeightRole::kWo, WeightRole::kWGateUp, WeightRole::kLmHead}) {
            CAPTURE(int(role));
            CHECK(find(rw, role).int4);
            CHECK(find(rw, role).mode == QuantMode::kW4A8);
            CHECK(find(rw, role).int4_group == 32);
            CHECK(find(rw, role).int4_kind == Int4Kind::kAffine);
        }
        // q, k Q4_K and v Q6_K: the fused q|k|v in its 4-bit form (Q6_K re-quantized) with the super-blocks of
        // each part beside (the CPU's W4A8 reads those); down (Q6_K) likewise.
        for (WeightRole role : {WeightRole::kWqkv, WeightRole::kWDown}) {
            CAPTURE(int(role));
            CHECK(find(rw, role).int4);
            CHECK(find(rw, role).int4_group == 32);
            CHECK(find(rw, role).mode == QuantMode::kW4A8);
        }
        HostTensor qkv = rw.read(find(rw, WeightRole::kWqkv));
        REQUIRE(qkv.q4.kq.size() == 3);
        CHECK(qkv.q4.kq[0].type == DType::kQ4_K);
        CHECK(qkv.q4.kq[1].type == DType::kQ4_K);
        CHECK(qkv.q4.kq[2].type == DType::kQ6_K);
        CHECK(qkv.q4.kq[2].rows == test::kKHeadDim);
        CHECK(qkv.q4.kq[2].blocks.size() == size_t(test::kKHeadDim * test::kKH / 256 * 210));
        CHECK(find(rw, WeightRole::kEmbed).dtype == DType::kF32);  // the Q4_K table widened
        HostTensor h = rw.read(find(rw, WeightRole::kWGateUp));
        REQUIRE(h.int4());
        CHECK(h.q4.n == 2 * test::kKF);
        CHECK(h.q4.d.size() == size_t(2 * test::kKF * test::kKH / 32));
        HostTensor e = rw.read(find(rw, WeightRole::kEmbed));
        CHECK(e.rows == test::kKV);
    }
    // tp 2: o_proj's 256 columns split at 128, inside a super-block of 256.
    o.tp = 2;
    o.tp_rank = 1;
    CHECK_THROWS_WITH_AS(
        RankWeights(*src, o),
        doctest::Contains("\"model.layers.0.self_attn.o_proj.weight\" is q4_K (groups of 256 along "
                          "its 256 columns); tp 2 gives rank 1 columns [128, 256), which cuts a group"),
        Error);
    // The same split of a Q6_K down_proj in an 8-bit run (read as float, still whole super-blocks only).
    test::KTypes six = all(DType::kQ6_K);
    six.o = DType::kQ8_0;
    auto s6 = open_model(k_file(six, "test_kquant_q6.gguf"));
    o.quant = QuantMode::kW8A8;
    CHECK_THROWS_WITH_AS(RankWeights(*s6, o), doctest::Contains("\"model.layers.0.mlp.down_proj.weight\" is q6_K"),
                         Error);
    o.tp = 1;
    o.tp_rank = 0;
    CHECK(find(RankWeights(*s6, o), WeightRole::kWDown).dtype == DType::kF32);
}

TEST_CASE("K-quant GGUF: a read for a K-quant CPU gives the super-blocks alone, packed to the full read's bytes") {
    auto src = open_model(k_file(test::KTypes{}, "test_kquant_alone.gguf"));
    ModelOptions o;
    o.quant = QuantMode::kW4A8;
    o.quant_head = true;
    RankWeights rw(*src, o);
    int alone = 0;
    for (const RankTensor& t : rw.tensors()) {
        if (!t.int4) continue;
        CAPTURE(t.name);
        HostTensor full = rw.read(t, false), kq = rw.read(t, true);
        const bool packed = RankWeights::kquant_packed(t, true);
        CHECK(kq.q4.kquant_only() == (packed && t.role != WeightRole::kEmbed));
        CHECK(kq.int4());
        CHECK_FALSE(full.q4.kquant_only());
        REQUIRE(full.q4.kq.size() == kq.q4.kq.size());
        for (size_t i = 0; i < kq.q4.kq.size(); ++i) CHECK(full.q4.kq[i].blocks == kq.q4.kq[i].blocks);
        if (!kq.q4.kquant_only()) continue;
        ++alone;
        CHECK(kq.q4.qs.empty());
        // The scalar level runs the K-quant layout on every machine.
        const PackedInt4 a = pack_int4_weights(full.q4.matrix(), IsaLevel::kScalar, true);
        const PackedInt4 b = pack_int4_weights(kq.q4.matrix(), IsaLevel::kScalar, true);
        CHECK(a.kq);
        CHECK(b.kq);
        CHECK(a.data == b.data);
        CHECK(a.panel_q6 == b.panel_q6);
        CHECK_THROWS_WITH_AS(pack_int4_weights(kq.q4.matrix(), IsaLevel::kScalar, false),
                             doctest::Contains("K-quant super-blocks only"), Error);
    }
    CHECK(alone >= 3);  // o, gate|up, down at least (q|k|v and the head where their parts are whole panels)
}

TEST_CASE("K-quant GGUF: --quant auto picks 4-bit when most linear weights are Q4_K, 8-bit for Q6_K / Q5_K") {
    auto mixed = open_model(k_file(test::KTypes{}, "test_kquant_auto.gguf"));  // down and v Q6_K, like layer 0
    CHECK(checkpoint_is_4bit(*mixed));
    CHECK(auto_quant(*mixed, false, QuantMode::kW4A8).quant == QuantMode::kW4A8);
    CHECK(auto_quant(*mixed, false, QuantMode::kW4A16).quant == QuantMode::kW4A16);
    for (DType t : {DType::kQ6_K, DType::kQ5_K}) {
        CAPTURE(dtype_name(t));
        auto src = open_model(k_file(all(t), "test_kquant_auto8.gguf"));
        CHECK_FALSE(checkpoint_is_4bit(*src));
        CHECK(checkpoint_is_quantized(*src));
        CHECK(auto_quant(*src, false, QuantMode::kW4A8).quant == QuantMode::kW8A8);
    }
    test::KTypes few = all(DType::kQ6_K);  // only o and down 4-bit: 512 of 1536 rows of 256
    few.o = few.down = DType::kQ4_K;
    CHECK_FALSE(checkpoint_is_4bit(*open_model(k_file(few, "test_kquant_auto_few.gguf"))));
}

TEST_CASE("K-quant GGUF: all-Q4_K W4A16 logits equal the f32 read up to the scales' f16 rounding; W4A8 in bounds") {
    auto src = open_model(k_file(all(DType::kQ4_K), "test_kquant_e2e.gguf"));
    const std::vector<std::vector<int32_t>> prompts = {random_ids(24, test::kKV, 3)};
    const auto f32 = score_all(*src, quant_options(QuantMode::kNone), prompts)[0];
    const auto w16 = score_all(*src, quant_options(QuantMode::kW4A16), prompts)[0];
    const auto w8 = score_all(*src, quant_options(QuantMode::kW4A8), prompts)[0];
    const double e16 = rel_error(w16.data(), f32.data(), f32.size()), e8 = rel_error(w8.data(), f32.data(), f32.size());
    MESSAGE("all-Q4_K GGUF against the file in fp32: W4A16 " << e16 << ", W4A8 " << e8);
    // Each weight moves by at most 2^-11 (~4.9e-4) of its group's scale and minimum.
    CHECK(e16 < 1e-3);
    CHECK(e8 < 5e-2);
    CHECK(e8 > e16);
    // The Q4_K_M mix (v and down Q6_K): W4A8 with the super-blocks kept, in the same bound.
    auto mix = open_model(k_file(test::KTypes{}, "test_kquant_e2e_mix.gguf"));
    const auto mf32 = score_all(*mix, quant_options(QuantMode::kNone), prompts)[0];
    const auto mw8 = score_all(*mix, quant_options(QuantMode::kW4A8), prompts)[0];
    const double em = rel_error(mw8.data(), mf32.data(), mf32.size());
    MESSAGE("Q4_K / Q6_K mix against the file in fp32: W4A8 " << em);
    CHECK(em < 5e-2);
}

TEST_CASE("gguf-py K-quant fixture model: W4A8 logits within the 4-bit GGUF tolerance of its f32 read") {
    const std::string path = std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/weights/data/kquant_blocks.gguf";
    ModelTensorsOnly src(open_model(path));
    const std::vector<std::vector<int32_t>> prompts = {random_ids(16, src.config().vocab, 5)};
    const auto f32 = score_all(src, quant_options(QuantMode::kNone), prompts)[0];
    const auto w8 = score_all(src, quant_options(QuantMode::kW4A8), prompts)[0];
    const double e8 = rel_error(w8.data(), f32.data(), f32.size());
    MESSAGE("K-quant fixture model against its f32 read: W4A8 " << e8);
    CHECK(e8 < 5e-2);
}

TEST_CASE("K-quant GGUF: resident bytes and the planner count what a loaded W4A8 model holds (Q4_K 4.5, Q6_K 6.6)") {
    auto src = open_model(k_file(test::KTypes{}, "test_kquant_bytes.gguf"));  // q, k, o, gate, up Q4_K; v, down Q6_K
    const bool kq = cpu_keeps_kquant();
    const double H = test::kKH, F = test::kKF, V = test::kKV, HD = test::kKHeadDim;
    // Per 16 channels and 256 columns: Q4_K 2304 bytes, Q6_K 3392; the tied Q4_K head one panel of 16; the
    // table (Q4_K in the file) and three norms f32. The group form: 20 bytes per 32 weights.
    const double q4_rows = 2 * HD + HD + H + 2 * F, q6_rows = HD + H;
    const double floats = V * H * 4 + 3 * H * 4;
    const double kq_linears = q4_rows / 16 * 2304 * (H / 256) + q6_rows / 16 * 3392 * (H / 256);
    const double group_linears = (q4_rows + q6_rows) * H / 32 * 20;
    for (QuantMode q : {QuantMode::kW4A8, QuantMode::kW4A16}) {
        CAPTURE(quant_mode_name(q));
        ModelOptions o = quant_options(q);
        o.quant_head = true;  // the tied Q4_K head a 4-bit linear of its own (a float one shares the table)
        CpuBackend be(CpuBackendOptions{1, false, false});
        const Model model(*src, be, o, nullptr);
        const double held = double(model.weight_bytes());
        const RankWeights rw(*src, o);
        const double resident = rw.resident_bytes({.cpu_kquant = kq});
        CHECK(std::abs(held - resident) < 128);  // the model holds a few bytes of its own beside the weights
        const bool kept = kq && q == QuantMode::kW4A8;
        CHECK(resident == (kept ? kq_linears + 2304 + floats : group_linears + V * H / 32 * 20 + floats));
        // A CPU without the K-quant kernels (AVX2) packs the group form: 5 bits a weight for Q6_K parts too.
        if (kept) CHECK(rw.resident_bytes({.cpu_kquant = false}) == group_linears + V * H / 32 * 20 + floats);
    }
    // The planner: the layers' linears at the file's mix (int4_bytes_per_weight), the group form without it.
    const double ratio = int4_bytes_per_weight(*src, true);
    CHECK(ratio == doctest::Approx(kq_linears / ((q4_rows + q6_rows) * H)));
    CHECK(int4_bytes_per_weight(*src, false) == doctest::Approx(20.0 / 32));
    PlanRequest r;
    r.model = src->config().dims();
    r.device = find_device("cpu");
    r.link = find_link(r.device.link);
    r.quant = PlanQuant::kW4A8;
    const double group = estimate_memory(r, 1, 1).weights;
    r.int4_bytes = ratio;
    const double planned = estimate_memory(r, 1, 1).weights;
    CHECK(group - planned == doctest::Approx((q4_rows + q6_rows) * H * (20.0 / 32 - ratio)));
}

}  // namespace test_kquant_gguf
