// The builder's API for the fronts, on one rank without MPI (the agreement is a stand-in that records
// what each rank would share and answers a chosen verdict):
//  - load(): a failure of the checks before any collective reaches the agreement with its code and
//    message, an agreed failure is AgreedFailure on every rank, silent peers give the rank's own Error,
//    and without an agreement nothing is shared;
//  - check_load(): the checkpoint and the layout, checked without loading;
//  - largest_rank_memory(): follows the loader's plan (a TP split halves the linears, the largest stage
//    of a PP split holds the larger layer range's KV cache, w8a8 is smaller than float, --quant auto of
//    a float checkpoint keeps it float), and refuses a layout or context the model cannot take;
//  - checked_parameter_count() and make_local_model();
//  - ModelConfig::active_parameter_count() and the planner's model_parameters / active_parameters agree.
#include <doctest/doctest.h>

#include <string>

#include "parallel/plan_model.h"
#include "runtime/builder/estimate.h"
#include "runtime/builder/load.h"
#include "runtime/weights/random_source.h"
#include "tests/test_build.h"

using namespace lattice;

namespace {

struct Shared {
    int calls = 0, code = -2;
    std::string message, detail;
};

LoadAgreement stand_in(Shared& seen, int verdict, int world = 3) {
    LoadAgreement a;
    a.world = world;
    a.rank = 0;
    a.agree = [&seen, verdict](int code, const std::string& message, const std::string& detail) {
        ++seen.calls;
        seen.code = code, seen.message = message, seen.detail = detail;
        return verdict;
    };
    return a;
}

// 32 heads: tp 3 cannot split them (the checks fail on every rank alike, before any collective).
ModelSpec preset_spec() {
    ModelSpec spec;
    spec.random = true;
    spec.preset = "tinyllama-1.1b";
    return spec;
}

}  // namespace

TEST_CASE("load: a failed check reaches the agreement, whose verdict every rank follows") {
    BuildOptions opt = test::cpu_options(1, 3, 1);
    Shared seen;
    SUBCASE("agreed failure") {
        try {
            load(opt, preset_spec(), stand_in(seen, 1));
            FAIL("load went on past an agreed failure");
        } catch (const AgreedFailure& f) {
            CHECK(f.code == 1);
        }
    }
    SUBCASE("silent peers: the rank's own error") {
        CHECK_THROWS_WITH_AS(load(opt, preset_spec(), stand_in(seen, -1)),
                             doctest::Contains("tp 3 does not divide num_attention_heads 32"), Error);
    }
    CHECK(seen.calls == 1);
    CHECK(seen.code == 1);
    CHECK(seen.message.find("tp 3 does not divide num_attention_heads 32") != std::string::npos);
    CHECK(seen.detail.size() > seen.message.size());  // the detailed form carries the origin
    CHECK(seen.detail.ends_with(seen.message));
}

TEST_CASE("load: the launched world must be the layout asked for") {
    BuildOptions opt = test::cpu_options(1, 1, 1);
    Shared seen;
    CHECK_THROWS_AS(load(opt, preset_spec(), stand_in(seen, 1, 2)), AgreedFailure);
    CHECK(seen.code == 1);
    CHECK(seen.message.find("tp") != std::string::npos);
}

TEST_CASE("load: one rank shares nothing") {
    BuildOptions opt = test::cpu_options(1, 1, 1);
    Shared seen;
    ModelSpec spec;
    spec.random = true;  // neither a preset nor a path: the build's own Error
    CHECK_THROWS_WITH_AS(load(opt, spec, stand_in(seen, 1, 1)), doctest::Contains("random weights need a preset"),
                         Error);
    CHECK(seen.calls == 0);
}

TEST_CASE("check_load: checkpoint and layout without loading") {
    CHECK_NOTHROW(check_load(preset_spec(), WorldConfig::make(4, 4, 1, 3)));
    CHECK_NOTHROW(check_load(preset_spec(), WorldConfig::make(2, 1, 2, 1)));
    CHECK_THROWS_WITH_AS(check_load(preset_spec(), WorldConfig::make(3, 3, 1, 0)),
                         doctest::Contains("num_attention_heads"), Error);
    ModelSpec missing;
    missing.path = "/nonexistent/lattice-model";
    CHECK_THROWS_WITH_AS(check_load(missing, WorldConfig{}), doctest::Contains("/nonexistent/lattice-model"), Error);
}

TEST_CASE("largest_rank_memory follows the loader's plan") {
    ModelConfig c = test::tiny_config("test_builder_front");
    c.n_layers = 3;  // pp 2: stages of 2 and 1 layers
    const auto src = make_random_source(c, 7, DType::kF32);
    MemoryQuery q;
    q.max_seq = 32;
    q.max_batch_tokens = 8;
    const RankMemory one = largest_rank_memory(*src, q);
    CHECK(one.quant == QuantMode::kNone);  // auto: a float checkpoint stays float
    CHECK(one.head == QuantMode::kNone);
    CHECK(one.max_seq == 32);
    CHECK(one.stage == 0);
    CHECK(one.kv == doctest::Approx(kv_cache_bytes(c.dims(), 1, 3, 32, 4)));
    CHECK(one.total() == doctest::Approx(one.weights + one.kv + one.activations));

    q.tp = 2;
    const RankMemory tp2 = largest_rank_memory(*src, q);
    CHECK(tp2.weights < one.weights);
    CHECK(tp2.kv == doctest::Approx(one.kv / 2));

    q.tp = 1;
    q.pp = 2;
    const RankMemory pp2 = largest_rank_memory(*src, q);
    CHECK(pp2.kv == doctest::Approx(kv_cache_bytes(c.dims(), 1, pp2.stage == 0 ? 2 : 1, 32, 4)));
    CHECK(pp2.total() < one.total());

    q.pp = 1;
    q.quant_auto = false;
    q.quant = QuantMode::kW8A8;
    q.quant_head = true;
    const RankMemory w8 = largest_rank_memory(*src, q);
    CHECK(w8.quant == QuantMode::kW8A8);
    CHECK(w8.head == QuantMode::kW8A8);
    CHECK(w8.weights < one.weights);

    q.max_seq = 65;
    CHECK_THROWS_WITH_AS(largest_rank_memory(*src, q), doctest::Contains("--max-seq 65 exceeds"), Error);
    q.max_seq = 0;
    CHECK(largest_rank_memory(*src, q).max_seq == 64);  // the model's own default, capped at its positions
    q.tp = 3;
    CHECK_THROWS_AS(largest_rank_memory(*src, q), Error);
}

TEST_CASE("checked_parameter_count and make_local_model") {
    const ModelConfig c = test::tiny_config("test_builder_front");
    const auto src = make_random_source(c, 7, DType::kF32);
    CHECK(checked_parameter_count(*src) == c.parameter_count());
    BackendOptions b;
    b.kind = BackendKind::kCpu;
    b.threads = 1;
    b.pin = false;
    ModelOptions mo;
    mo.max_seq = 16;
    mo.max_batch_tokens = 8;
    const LocalModel m = make_local_model(*src, b, mo);
    REQUIRE(m.model != nullptr);
    CHECK(m.backend->device() == Device::kCpu);
    CHECK(m.model->max_seq() == 16);
    CHECK(m.model->config().n_layers == c.n_layers);
}

TEST_CASE("parameter counts: the config's and the planner's agree, dense and MoE") {
    ModelConfig c = test::tiny_config("test_builder_front");
    CHECK(c.active_parameter_count() == c.parameter_count());  // dense: every parameter runs
    CHECK(model_parameters(c.dims()) == doctest::Approx(double(c.parameter_count())));
    CHECK(active_parameters(c.dims()) == doctest::Approx(double(c.parameter_count())));
    c.n_experts = 4;
    c.n_experts_used = 2;
    const int64_t unused_ffns = c.n_layers * 2 * 3 * c.hidden * c.intermediate;  // two experts' FFNs per layer
    CHECK(c.active_parameter_count() == c.parameter_count() - unused_ffns);
    CHECK(model_parameters(c.dims()) == doctest::Approx(double(c.parameter_count())));
    CHECK(active_parameters(c.dims()) == doctest::Approx(double(c.active_parameter_count())));
}

namespace {
Tokenizer byte_tokenizer(std::vector<std::string> tokens) {
    TokenizerSpec s;
    s.kind = TokenizerKind::kSentencePiece;
    s.tokens = std::move(tokens);
    s.scores.assign(s.tokens.size(), 0.0f);
    s.source = "test";
    return Tokenizer(std::move(s));
}
}  // namespace

TEST_CASE("check_draft_vocabulary: the first id whose pieces differ is named") {
    const Tokenizer target = byte_tokenizer({"<unk>", "<s>", "</s>", "a", "b", "c"});
    // The same pieces (a smaller draft shares the target's first ids): accepted.
    CHECK_NOTHROW(check_draft_vocabulary(target, byte_tokenizer({"<unk>", "<s>", "</s>", "a", "b", "c"}), "d"));
    CHECK_NOTHROW(check_draft_vocabulary(target, byte_tokenizer({"<unk>", "<s>", "</s>", "a"}), "d"));
    // The same count, one piece moved: refused at its id, naming both pieces and the draft.
    try {
        check_draft_vocabulary(target, byte_tokenizer({"<unk>", "<s>", "</s>", "a", "c", "b"}), "drafts/x.gguf");
        FAIL("a draft with other pieces was accepted");
    } catch (const Error& e) {
        const std::string m = e.message();
        CHECK(m.find("drafts/x.gguf") != std::string::npos);
        CHECK(m.find("token 4") != std::string::npos);
        CHECK(m.find("\"c\"") != std::string::npos);
        CHECK(m.find("\"b\"") != std::string::npos);
    }
}
