// INT8 accuracy on the golden models: relative logits error of W8A16 and W8A8 against the
// float64 reference, per case, and top-1 agreement with the fp32 engine (reported).
// Bounds: see the comment in the first test case (one golden model is ill-conditioned, shown by the second).
#include <doctest/doctest.h>

#include <algorithm>

#include "tests/runtime/model/quant_test_util.h"
#include "tests/runtime/model/golden.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

int64_t argmax(const float* row, int64_t n) {
    return int64_t(std::max_element(row, row + n) - row);
}

// Positions where the argmax of a equals that of b, and the total.
std::pair<int64_t, int64_t> top1_agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
    int64_t same = 0, total = int64_t(a.size()) / V;
    for (int64_t i = 0; i < total; ++i) same += argmax(a.data() + i * V, V) == argmax(b.data() + i * V, V);
    return {same, total};
}

}  // namespace

TEST_CASE("golden models: W8A16 / W8A8 logits error against the float64 reference, top-1 vs fp32") {
    // Measured 2026-11-29, worst case per model (docs/quantization.md): tiny-llama2 W8A16 0.012 / W8A8 0.018,
    // tiny-gqa-llama3 0.018 / 0.029, tiny-fp16-tied 0.062 / 0.089. tiny-fp16-tied exceeds the general
    // 3e-2 / 8e-2: its logits move 6% when the weights are merely rounded to int8 (the fake-quantized
    // fp32 run below reproduces W8A16 to 2e-6), i.e. that random model is ill-conditioned, not the
    // kernels wrong. It gets its own bounds (1.6x / 1.7x its measurement); the others get the general
    // W8A16 bound and a W8A8 bound tightened from 8e-2 to 5e-2.
    for (const auto& name : golden_models()) {
        CAPTURE(name);
        const bool ill = name == "tiny-fp16-tied";
        const double kMaxW8A16 = ill ? 1e-1 : 3e-2, kMaxW8A8 = ill ? 1.5e-1 : 5e-2;
        auto src = open_model(golden_dir(name));
        const int64_t V = src->config().vocab;
        auto cases = load_golden(name);
        REQUIRE(!cases.empty());
        std::vector<std::vector<int32_t>> prompts;
        for (const auto& c : cases) prompts.push_back(c.prompt);
        auto f32 = score_all(*src, quant_options(QuantMode::kNone), prompts);
        auto w16 = score_all(*src, quant_options(QuantMode::kW8A16), prompts);
        auto w8 = score_all(*src, quant_options(QuantMode::kW8A8), prompts);
        double worst16 = 0, worst8 = 0, worst32 = 0;
        int64_t same16 = 0, same8 = 0, total = 0;
        for (size_t i = 0; i < cases.size(); ++i) {
            CAPTURE(i);
            const std::vector<float>& ref = cases[i].logits;
            REQUIRE(ref.size() == prompts[i].size() * size_t(V));
            REQUIRE(w16[i].size() == ref.size());
            REQUIRE(w8[i].size() == ref.size());
            const double e32 = rel_error(f32[i].data(), ref.data(), ref.size());
            const double e16 = rel_error(w16[i].data(), ref.data(), ref.size());
            const double e8 = rel_error(w8[i].data(), ref.data(), ref.size());
            CHECK(e16 < kMaxW8A16);
            CHECK(e8 < kMaxW8A8);
            // Quantization must actually have happened (and be worse than fp32).
            CHECK(e16 > 10 * e32);
            CHECK(e8 > e32);
            worst32 = std::max(worst32, e32);
            worst16 = std::max(worst16, e16);
            worst8 = std::max(worst8, e8);
            auto [s16, n] = top1_agreement(w16[i], f32[i], V);
            auto [s8, n8] = top1_agreement(w8[i], f32[i], V);
            same16 += s16;
            same8 += s8;
            total += n;
        }
        MESSAGE(name << ": worst relative logits error vs float64: fp32 " << worst32 << ", W8A16 " << worst16
                     << ", W8A8 " << worst8 << "; top-1 agreement with fp32: W8A16 " << same16 << "/" << total
                     << ", W8A8 " << same8 << "/" << total);
        // Top-1 flips where fp32's top two are nearly tied (measured 84-98%); a broken path agrees ~1/vocab.
        CHECK(double(same16) >= 0.75 * double(total));
        CHECK(double(same8) >= 0.75 * double(total));
    }
}

TEST_CASE("W8A16 equals the fp32 engine on fake-quantized weights: the error above is the weights' rounding") {
    // Separates kernel bugs from model sensitivity: the fp32 path on weights rounded through the
    // int8 scheme must give W8A16's logits to float accumulation-order noise.
    for (const auto& name : golden_models()) {
        CAPTURE(name);
        auto src = open_model(golden_dir(name));
        FakeQuantSource fq(open_model(golden_dir(name)));
        std::vector<std::vector<int32_t>> prompts;
        for (const auto& c : load_golden(name)) prompts.push_back(c.prompt);
        auto w16 = score_all(*src, quant_options(QuantMode::kW8A16), prompts);
        auto fake = score_all(fq, quant_options(QuantMode::kNone), prompts);
        auto f32 = score_all(*src, quant_options(QuantMode::kNone), prompts);
        double worst = 0, worst_q = 0;
        for (size_t i = 0; i < prompts.size(); ++i) {
            worst = std::max(worst, rel_error(w16[i].data(), fake[i].data(), fake[i].size()));
            worst_q = std::max(worst_q, rel_error(fake[i].data(), f32[i].data(), f32[i].size()));
        }
        MESSAGE(name << ": W8A16 vs fp32 on fake-quantized weights " << worst
                     << " (their distance from fp32: " << worst_q << ")");
        CHECK(worst < 1e-4);
        CHECK(worst_q > 1e-3);
    }
}

TEST_CASE("fused W8A8 quantization (norm / SiLU quantize, linear_quant; the CPU mirror) equals the unfused path bit for bit") {
    // The model's fused path is what a device backend runs (Backend::fuses_quant); on CPU its mirror
    // quantizes with the kernels' own row quantize, so any difference is a wiring error in the model
    // (a norm quantized from the wrong buffer, a stale row, the first layer's norm, the SiLU output).
    for (const auto& name : golden_models()) {
        CAPTURE(name);
        auto src = open_model(golden_dir(name));
        std::vector<std::vector<int32_t>> prompts;
        for (const auto& c : load_golden(name)) prompts.push_back(c.prompt);
        for (int threads : {1, 2}) {
            CAPTURE(threads);
            CpuBackendOptions plain{threads, false, false}, fused = plain;
            fused.fused_quant = true;
            CpuBackend be_plain(plain), be_fused(fused);
            const ModelOptions mo = quant_options(QuantMode::kW8A8);
            Model m_plain(*src, be_plain, mo, nullptr), m_fused(*src, be_fused, mo, nullptr);
            CHECK_FALSE(m_plain.fused_quant());
            REQUIRE(m_fused.fused_quant());
            auto g_plain = make_local_engine(m_plain), g_fused = make_local_engine(m_fused);
            for (const auto& p : prompts) {
                const std::vector<float> a = g_plain->score(p), b = g_fused->score(p);
                REQUIRE(a.size() == b.size());
                CHECK(a == b);
            }
            // Chunked decode through the KV cache too: greedy tokens and their order.
            GenerateRequest r{prompts[0], 6, 0, {}, true, {}};
            CHECK(g_fused->generate(r).tokens == g_plain->generate(r).tokens);
        }
        // Only W8A8 is fused: W8A16 on the same backend runs the unfused ops.
        CpuBackendOptions fused{1, false, false};
        fused.fused_quant = true;
        CpuBackend be(fused);
        Model m16(*src, be, quant_options(QuantMode::kW8A16), nullptr);
        CHECK_FALSE(m16.fused_quant());
    }
}
