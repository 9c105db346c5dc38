// A GGUF 4-bit checkpoint in a 4-bit run (tests/runtime/weights/q4_gguf.h: Q4_0 / Q4_1 linears, a Q8_0 tied
// embedding): the plan reads the linears as raw blocks (a fused q|k|v only when its parts share a type), keeps
// the LM head 8-bit unless it is 4-bit in the file, and counts 18 / 20 bytes per 32 weights; a tp split that
// cuts a block is refused naming the tensor; --quant auto picks W4A8 on the CPU, W4A16 on CUDA; and the W4A16
// logits equal an fp32 run of the same file (the blocks dequantized to f32) to float summation noise, so the
// raw-block path holds exactly the file's values.
#include <doctest/doctest.h>

// GCC 12 reports a false -Wstringop-overflow inside std::vector::insert when GgufBuilder::build is inlined here.
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <string>

#include "runtime/builder/build.h"
#include "runtime/model/rank_weights.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/model/quant_test_util.h"
#include "tests/runtime/weights/q4_gguf.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

std::string q4_file(const test::Q4Types& ty, const char* name) {
    return test::write_file(std::string(LATTICE_BINARY_DIR) + "/" + name, test::q4_llama_gguf(ty));
}

const RankTensor& find(const RankWeights& rw, WeightRole role) {
    for (const RankTensor& t : rw.tensors())
        if (t.role == role) return t;
    FAIL("no tensor of role " << int(role));
    return rw.tensors().front();
}

}  // namespace

TEST_CASE("4-bit GGUF: the plan reads Q4 blocks raw, keeps a Q8_0 head 8-bit, refuses a split through a block") {
    auto src = open_model(q4_file(test::Q4Types{}, "test_int4_plan.gguf"));
    ModelOptions o;
    o.quant = QuantMode::kW4A8;
    o.quant_head = true;
    {
        RankWeights rw(*src, o);
        for (WeightRole role : {WeightRole::kWqkv, WeightRole::kWo, WeightRole::kWGateUp, WeightRole::kWDown}) {
            CHECK(find(rw, role).int4);
            CHECK(find(rw, role).mode == QuantMode::kW4A8);
            CHECK(find(rw, role).int4_group == 32);
        }
        CHECK(find(rw, WeightRole::kWqkv).int4_kind == Int4Kind::kAffine);
        CHECK(find(rw, WeightRole::kWo).int4_kind == Int4Kind::kOffset8);
        const RankTensor& head = find(rw, WeightRole::kLmHead);  // tied, Q8_0 in the file
        CHECK(head.mode == QuantMode::kW8A8);
        CHECK_FALSE(head.int4);
        CHECK(head.dtype == DType::kF32);
        // 16-channel panels, per 32 weights 16 B of nibbles + f16 d (+ f16 m for Q4_1); the head int8 + 8 B per
        // row; the embedding table (Q8_0 in the file) f32; three f32 norms.
        const double H = test::kQ4H, F = test::kQ4F, V = test::kQ4V;
        const double want = 3 * H * H / 32 * 20 + H * H / 32 * 18 + 2 * F * H / 32 * 20 + H * F / 32 * 18 +
                            (V * H + 8 * V) + V * H * 4 + 3 * H * 4;
        CHECK(rw.resident_bytes({}) == doctest::Approx(want));
        HostTensor h = rw.read(find(rw, WeightRole::kWqkv));
        REQUIRE(h.int4());
        CHECK(h.q4.n == 3 * test::kQ4H);
        CHECK(h.q4.kind == Int4Kind::kAffine);
        CHECK(h.q4.qs.size() == size_t(3 * H * H / 2));
    }
    o.quant = QuantMode::kW4A16;
    CHECK(find(RankWeights(*src, o), WeightRole::kLmHead).mode == QuantMode::kW8A16);
    o.quant = QuantMode::kW8A8;
    CHECK_FALSE(find(RankWeights(*src, o), WeightRole::kWqkv).int4);  // 8-bit runs read float
    CHECK(find(RankWeights(*src, o), WeightRole::kWqkv).dtype == DType::kF32);
    // q and k of different block types: the fused q|k|v is read as f32 and quantized to 4 bits at load.
    test::Q4Types mixed;
    mixed.k = DType::kQ4_0;
    auto msrc = open_model(q4_file(mixed, "test_int4_mixed.gguf"));
    o.quant = QuantMode::kW4A8;
    CHECK_FALSE(find(RankWeights(*msrc, o), WeightRole::kWqkv).int4);
    CHECK(find(RankWeights(*msrc, o), WeightRole::kWqkv).dtype == DType::kF32);
    CHECK(find(RankWeights(*msrc, o), WeightRole::kWqkv).mode == QuantMode::kW4A8);
    CHECK(find(RankWeights(*msrc, o), WeightRole::kWo).int4);
    // tp 2: down_proj's 96 columns split at 48, inside a block of 32.
    o.tp = 2;
    o.tp_rank = 1;
    CHECK_THROWS_WITH_AS(RankWeights(*src, o), doctest::Contains("model.layers.0.mlp.down_proj.weight\" is 4-bit"),
                         Error);
    CHECK_THROWS_WITH_AS(RankWeights(*src, o), doctest::Contains("columns [48, 96), which cuts a group"), Error);
}

TEST_CASE("4-bit GGUF: --quant auto picks W4A8 on the CPU, W4A16 on CUDA; W4A16 logits equal the file in fp32") {
    auto src = open_model(q4_file(test::Q4Types{}, "test_int4_e2e.gguf"));
    CHECK(checkpoint_is_4bit(*src));
    const QuantChoice cpu = auto_quant(*src, false, QuantMode::kW4A8), other = auto_quant(*src, false, QuantMode::kNone);
    const QuantChoice cuda = auto_quant(*src, false, int4_mode_for(BackendKind::kCuda));
    CHECK(cpu.quant == QuantMode::kW4A8);
    CHECK(cpu.quant_head);
    CHECK(other.quant == QuantMode::kW8A8);
    CHECK(cuda.quant == QuantMode::kW4A16);  // CUDA's 4-bit kernels are W4A16
    CHECK(cuda.quant_head);
    CHECK(int4_mode_for(BackendKind::kCpu) == QuantMode::kW4A8);
    CHECK(int4_mode_for(BackendKind::kSim) == QuantMode::kNone);
    CHECK_THROWS_AS(auto_quant(*src, false, QuantMode::kW8A8), Error);
    const std::vector<std::vector<int32_t>> prompts = {random_ids(24, test::kQ4V, 3)};
    const auto f32 = score_all(*src, quant_options(QuantMode::kNone), prompts)[0];
    const auto w16 = score_all(*src, quant_options(QuantMode::kW4A16), prompts)[0];
    const auto w8 = score_all(*src, quant_options(QuantMode::kW4A8), prompts)[0];
    const double e16 = rel_error(w16.data(), f32.data(), f32.size()), e8 = rel_error(w8.data(), f32.data(), f32.size());
    MESSAGE("4-bit GGUF against the file in fp32: W4A16 " << e16 << ", W4A8 " << e8);
    CHECK(e16 < 1e-5);
    CHECK(e8 < 5e-2);
    CHECK(e8 > e16);
}
