// The KV cache's element types (--kv-cache-dtype, runtime/backend/backend.h KvDtype) through the whole
// forward, on the golden models of ../shared/golden (independent float64 reference):
//  - f16, bf16 and int8 caches: the logits of every prompt position near the reference (the bound per
//    dtype below: each is what storing k and v in that type costs, measured, with headroom), and every
//    greedy token equal to the reference's, or the first divergence a near tie: the f32-cache engine's
//    own logits at that step put the two tokens closer than the dtype's logits bound times the row's largest
//    |logit| (what the cache's rounding may move a logit by; test_dtype_bf16's rule. An absolute 0.05 nats
//    was tighter than the bound itself: tiny-fp16-tied's logits span ~4.6 there, and a bf16 cache's 1.4%
//    error flipped a 0.066 tie after a change of the softmax's rounding, 2026-12-07);
//  - the cache's bytes per block: f16 half of f32, int8 (head_dim + 4) / (4 head_dim) of it;
//  - the NLL of a model's text (its cases' prompts and reference continuations) with an int8 cache
//    within 0.01 nats of the same with an f16 cache (the int8 cache's accuracy bound; relative where the random-weight
//    models' logits make 0.01 nats meaningless, see the case; the built-in model's is in test_smollm_nll).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/model/nll.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

struct Run {
    CpuBackend be{CpuBackendOptions{1, false, false}};
    std::unique_ptr<Model> model;
    std::unique_ptr<Engine> engine;
    Run(const TensorSource& src, KvDtype kv) {
        ModelOptions mo;
        mo.kv_dtype = kv;
        model = std::make_unique<Model>(src, be, mo, nullptr);
        engine = make_local_engine(*model);
    }
};

}  // namespace

TEST_CASE("golden models with f16, bf16 and int8 KV caches: logits near the reference, greedy tokens equal or a near tie") {
    for (const auto& m : golden_models()) {
        auto src = open_model(golden_dir(m));
        const auto cases = load_golden(m);
        const int64_t V = src->config().vocab;
        Run f32(*src, KvDtype::kF32);
        CHECK(f32.model->kv_dtype() == DType::kF32);
        for (const KvDtype kv : {KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8}) {
            CAPTURE(m);
            CAPTURE(kv_dtype_name(kv));
            Run r(*src, kv);
            const int64_t hd = src->config().head_dim;
            const double bytes = double(r.model->kv_bytes_per_block()) / double(f32.model->kv_bytes_per_block());
            CHECK(bytes == doctest::Approx(kv == KvDtype::kInt8 ? double(hd + 4) / double(4 * hd) : 0.5));
            // Measured maxima over these models (2026-12-05): f16 1.5e-3, bf16 1.2e-2, int8 2.9e-2, all on
            // tiny-fp16-tied (its logits are the most sensitive to k/v rounding: f32's own error there is
            // far below); elsewhere int8 stays under 9e-3.
            const double bound = kv == KvDtype::kF16 ? 2.5e-3 : kv == KvDtype::kBF16 ? 2e-2 : 5e-2;
            for (size_t ci = 0; ci < cases.size(); ++ci) {
                const GoldenCase& c = cases[ci];
                CAPTURE(ci);
                const std::vector<float> logits = r.engine->score(c.prompt);
                const double err = rel_error(logits.data(), c.logits.data(), logits.size());
                MESSAGE(m << " case " << ci << " " << kv_dtype_name(kv) << " KV: logits rel err " << err);
                CHECK(err < bound);
                // The first divergence: how far apart the two tokens were, by the f32 cache's logits.
                const Divergence d = greedy_divergence(*r.engine, *f32.engine, c, V);
                if (d.step < 0) continue;
                MESSAGE(m << " case " << ci << " " << kv_dtype_name(kv) << " KV: greedy diverges at step " << d.step
                          << ", margin " << d.margin << " of a row spanning " << d.span);
                CHECK(d.margin < bound * d.span);
            }
        }
    }
}

TEST_CASE("golden models: NLL of their cases' texts with an int8 KV cache within 0.01 nats of an f16 one") {
    // A model's text: every case's prompt and reference continuation, each scored on its own, the NLL
    // the mean over all their tokens. tiny-llama2 and tiny-gqa-llama3 are random-weight models whose
    // random prompt tokens score 10-42 nats each (a uniform guess is ln 1024 = 6.9): there the logits
    // span tens of nats and any 8-bit cache moves the NLL by more than 0.01 nats in absolute terms
    // (bf16 by up to 0.008 on one case), so the bound there is relative, 1e-3 of the NLL.
    for (const auto& m : golden_models()) {
        auto src = open_model(golden_dir(m));
        const int64_t V = src->config().vocab;
        Run f16(*src, KvDtype::kF16), i8(*src, KvDtype::kInt8);
        double sum_f16 = 0, sum_i8 = 0, n = 0;
        for (const GoldenCase& c : load_golden(m)) {
            std::vector<int32_t> text = c.prompt;
            text.insert(text.end(), c.greedy.begin(), c.greedy.end());
            const double w = double(text.size() - 1);
            sum_f16 += w * mean_nll(f16.engine->score(text), text, V);
            sum_i8 += w * mean_nll(i8.engine->score(text), text, V);
            n += w;
        }
        const double a = sum_f16 / n, b = sum_i8 / n;
        MESSAGE(m << ": NLL/token over " << n << " tokens, f16 KV " << a << ", int8 KV " << b << " (int8 - f16 = "
                  << b - a << ")");
        CAPTURE(m);
        REQUIRE(std::isfinite(a));
        CHECK(std::fabs(b - a) < (a > std::log(double(V)) ? 1e-3 * a : 0.01));
        CHECK(b != a);  // the cache did change
    }
}
