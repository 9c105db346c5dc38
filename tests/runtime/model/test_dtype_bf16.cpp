// `--dtype bf16` on the CPU (CpuBackendOptions::bf16) through the whole forward of the golden models of
// ../shared/golden (independent float64 reference):
//  - float linears rounded to bf16 (an f32 checkpoint's linears take half the bytes), the KV cache bf16 under
//    --kv-cache-dtype auto, the logits of every prompt position near the reference (bf16 weights, inputs and
//    cache cost about what the bf16 cache alone costs, test_kv_cache.cpp: the bound below is measured with
//    headroom) and the greedy tokens those of the reference or the first divergence a near tie;
//  - where the CPU has AVX512_BF16 ([bf16dot], its own ctest entry, SKIP elsewhere; lattice's kernels, not
//    oneDNN's, whatever the level): the linears packed for the bf16 pairs, the logits different from the same weights
//    under the widened math (LATTICE_ISA=avx2: the pairs ran), and one token at a time equal to the prompt in one call,
//    bit for bit;
//  - elsewhere (and under LATTICE_ISA=avx2) the bf16 weights run the widened math, also near the reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_bf16.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "runtime/model/rank_weights.h"
#include "tests/kernels/cpu/int8_test_util.h"
#include "tests/runtime/model/golden.h"
#include "tests/test_skip.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

// A divergence of the greedy tokens is bf16's rounding where the two tokens were within this share of the row's
// largest logit by f32's logits (the logits' own bound below is the same share; measured 1.4% and 0.4%).
constexpr double kNearTie = 3e-2;

struct Run {
    CpuBackend be;
    std::unique_ptr<Model> model;
    std::unique_ptr<Engine> engine;
    Run(const TensorSource& src, bool bf16, int threads = 1)
        : be(CpuBackendOptions{threads, false, false, false, false, false, bf16}) {
        model = std::make_unique<Model>(src, be, ModelOptions{}, nullptr);
        engine = make_local_engine(*model);
    }
};

// The prompt logits of every case near the reference, greedy tokens equal or a near tie (by f32's logits);
// returns the logits of all cases, concatenated.
std::vector<float> check_near_reference(const std::string& m, Run& r, Run& f32) {
    const int64_t V = f32.model->config().vocab;
    std::vector<float> all;
    for (const GoldenCase& c : load_golden(m)) {
        const std::vector<float> logits = r.engine->score(c.prompt);
        const double err = rel_error(logits.data(), c.logits.data(), logits.size());
        MESSAGE(m << ": logits rel err " << err);
        // Measured maxima over these models (2026-12-07, Zen 4): 1.3e-2 with the bf16 pairs, 1.2e-2 widened.
        CHECK(err < 3e-2);
        all.insert(all.end(), logits.begin(), logits.end());
        const Divergence d = greedy_divergence(*r.engine, *f32.engine, c, V);
        if (d.step < 0) continue;
        MESSAGE(m << ": greedy diverges at step " << d.step << ", margin " << d.margin << ", max |logit| " << d.span);
        CHECK(d.margin < kNearTie * d.span);
    }
    return all;
}

// The cache bf16; the weights of these bf16 / f16 checkpoints in as many bytes as the default holds (packing pads
// a linear to 16 channels: 2% at most here), except a tied f16 head: in bf16 beside the f16 embedding table; and
// the memory estimate (RankWeights::resident_bytes with cpu_bf16_linear_bytes, what `lattice info --dtype bf16`
// prints) those bytes.
void check_bytes(const std::string& m, const TensorSource& src, const Run& r, const Run& f32) {
    CHECK(r.model->kv_dtype() == DType::kBF16);
    CHECK(f32.model->kv_dtype() == DType::kF32);
    const ModelConfig& c = src.config();
    DType ckpt = DType::kBF16;  // the checkpoint's matrices
    for (const std::string& n : src.tensor_names())
        if (src.info(n).shape.size() == 2) {
            ckpt = src.info(n).dtype;
            break;
        }
    const bool tied_f16 = c.tie_embeddings && ckpt != DType::kBF16;
    const double head = tied_f16 ? double(c.vocab * c.hidden * 2) : 0.0;
    MESSAGE(m << ": weight bytes " << r.model->weight_bytes() << " (default: " << f32.model->weight_bytes() << ")");
    CHECK(double(r.model->weight_bytes()) >= double(f32.model->weight_bytes()) + head);
    CHECK(double(r.model->weight_bytes()) <= 1.02 * double(f32.model->weight_bytes()) + head);
    const RankWeights rw(src, ModelOptions{});
    const double estimate = rw.resident_bytes({.cpu_kquant = cpu_keeps_kquant(), .cpu_bf16 = &cpu_bf16_linear_bytes});
    MESSAGE(m << ": estimate " << estimate);
    CHECK(std::abs(double(r.model->weight_bytes()) - estimate) < 128);  // a few bytes of the model's own
    CHECK(std::abs(double(f32.model->weight_bytes()) - rw.resident_bytes({.cpu_kquant = cpu_keeps_kquant()})) < 128);
}

}  // namespace

TEST_CASE("--dtype bf16 on the CPU, widened math (LATTICE_ISA=avx2): bf16 weights and cache near the reference") {
    if (!isa_supported(IsaLevel::kAvx2)) LATTICE_SKIP("this CPU has no AVX2");  // never on x86-64 CI machines
    test::IsaOverride cap(IsaLevel::kAvx2);
    for (const auto& m : golden_models()) {
        CAPTURE(m);
        auto src = open_model(golden_dir(m));
        Run f32(*src, false), r(*src, true);
        check_bytes(m, *src, r, f32);
        check_near_reference(m, r, f32);
    }
}

TEST_CASE("--dtype bf16 on the CPU [bf16dot]: the bf16 pairs near the reference, one token at a time equal to the "
          "prompt") {
    if (!gemm_bf16_dot_available()) LATTICE_SKIP("no AVX512_BF16 at the avx512 level here: --dtype bf16 runs widened");
    // The pairs for every m (on AMX Xeons the default gives m >= 16 to oneDNN, whose sums differ by rounding).
    test::ProviderGuard own(Int8Provider::kOwn);
    for (const auto& m : golden_models()) {
        CAPTURE(m);
        auto src = open_model(golden_dir(m));
        Run f32(*src, false), r(*src, true, 2);
        check_bytes(m, *src, r, f32);
        const std::vector<float> dot = check_near_reference(m, r, f32);
        std::vector<float> wide;
        {
            test::IsaOverride cap(IsaLevel::kAvx2);
            Run w(*src, true);
            for (const GoldenCase& c : load_golden(m)) {
                const std::vector<float> l = w.engine->score(c.prompt);
                wide.insert(wide.end(), l.begin(), l.end());
            }
        }
        REQUIRE(wide.size() == dot.size());
        CHECK(wide != dot);  // the pairs ran (x rounded to bf16)
        // One token at a time: the last position's logits after each step equal the prompt's row, bit for bit.
        const GoldenCase c = load_golden(m)[0];
        const int64_t V = src->config().vocab;
        const std::vector<float> whole = r.engine->score(c.prompt);
        Model& model = *r.model;
        const AttentionShape& a = model.attention_shape();
        model.allocate_kv((int64_t(c.prompt.size()) + a.block_size - 1) / a.block_size);
        std::vector<int32_t> table(size_t(a.table_width), -1);
        for (int64_t b = 0; b * a.block_size < int64_t(c.prompt.size()); ++b) table[size_t(b)] = int32_t(b);
        std::vector<float> step(static_cast<size_t>(V));
        for (size_t t = 0; t < c.prompt.size(); ++t) {
            int32_t tok = c.prompt[t], pos = int32_t(t), s0 = 0;
            model.forward(TokenBatch{&tok, &pos, &s0, 1, table.data(), 1, a.table_width}, {0}, step.data());
            CAPTURE(t);
            CHECK(std::memcmp(step.data(), whole.data() + t * size_t(V), size_t(V) * sizeof(float)) == 0);
        }
    }
}
