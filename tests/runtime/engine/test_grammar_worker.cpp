// Structured output's masks off the step's critical path (runtime/engine/grammar_worker.h and the
// Scheduler): EngineCore with one rank and a runner that samples within each mask, no model. While
// the mask of a 200-property schema request is held unfinished on the mask thread, a plain request
// beside it runs every one of its steps (as many as alone) and never waits for it: the schema request
// sits those steps out, the scheduler computes no mask itself, and its waits per step stay within
// the bound it states. Released, the schema request ends well-formed within max_tokens, and a
// request with max_tokens at its schema's shortest document still ends well-formed through the
// worker. MaskWorker alone: a mask handed over equals the matcher's own, a replaced or forgotten job
// is never handed over.
#include <doctest/doctest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine/engine_core.h"
#include "runtime/engine/grammar_worker.h"
#include "tests/runtime/engine/fake_comm.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_grammar_worker {

using namespace lattice;
using namespace lattice::testing;

namespace {

constexpr int32_t kEnd = 256;  // the byte vocabulary's end id (ids 0..255: one byte each)

std::shared_ptr<const TokenVocab> byte_vocab() {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    t.push_back("");
    return std::make_shared<const TokenVocab>(t, std::vector<int32_t>{kEnd});
}

std::shared_ptr<const Grammar> props_grammar(int n) {
    nlohmann::ordered_json s = {{"type", "object"}, {"properties", nlohmann::json::object()}, {"required", {}}};
    for (int i = 0; i < n; ++i) {
        const std::string k = "p" + std::to_string(i);
        s["properties"][k] = {{"type", i % 2 ? "integer" : "string"}};
        s["required"].push_back(k);
    }
    return Grammar::compile({GrammarSpec::Kind::kJsonSchema, s.dump(), {}});
}

// Samples, for a masked sequence, the allowed byte that follows the previous one's in the cycle
// `cycle` (a model that varies its output), the end id when only it is allowed; plain sequences get
// fake_token. Records which sequences each plan sampled.
class MaskedRunner final : public ModelRunner {
public:
    void execute(const StepPlan& p, StepResults* out) override {
        out->tokens.clear();
        size_t mask = 0;
        std::vector<int64_t> sampled;
        for (const PlanSeq& ps : p.seqs) {
            if (!ps.sample) continue;
            sampled.push_back(ps.id);
            int32_t tok = fake_token(ps.id, ps.start + ps.count);
            if (ps.masked) {
                const uint32_t* w = p.masks.data() + mask;
                mask += size_t(p.mask_width);
                auto allowed = [&](int32_t id) { return (w[id / 32] >> (id % 32)) & 1u; };
                tok = allowed(kEnd) ? kEnd : -1;
                int32_t& at = next_[ps.id];
                for (int k = 0; k < 256; ++k)
                    if (allowed((at + k) % 256)) {
                        tok = (at + k) % 256;
                        break;
                    }
                at = (tok + 7) % 256;
                REQUIRE(tok >= 0);
            }
            out->tokens.push_back(SampledToken{tok, -0.5f});
        }
        plans.push_back(sampled);
    }
    void release(std::span<const int64_t>) override {}
    std::vector<std::vector<int64_t>> plans;

private:
    std::map<int64_t, int32_t> next_;
};

EngineCoreOptions options() {
    EngineCoreOptions o;
    o.sched.step_tokens = 8;
    o.sched.max_seqs = 4;
    o.sched.max_seq = 4096;
    o.sched.vocab = 257;
    o.sched.eos_ids = {kEnd};
    o.kv_blocks = 1024;
    o.block_size = 16;
    o.prefix_caching = false;
    return o;
}

EngineRequest request(int64_t max_new, std::shared_ptr<const Grammar> g = nullptr) {
    EngineRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = max_new;
    if (g) r.grammar = std::make_shared<GrammarMatcher>(g, byte_vocab());
    return r;
}

struct Output {
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
};

void absorb(std::map<int64_t, Output>& out, const std::vector<TokenEvent>& events) {
    for (const TokenEvent& e : events) {
        if (e.token >= 0) out[e.id].tokens.push_back(e.token);
        if (e.finish != FinishReason::kNone) out[e.id].finish = e.finish;
    }
}

std::string text_of(const std::vector<int32_t>& tokens) {
    std::string s;
    for (int32_t t : tokens)
        if (t != kEnd) s += char(t);
    return s;
}

int64_t steps_with(const MaskedRunner& r, int64_t id) {
    int64_t n = 0;
    for (const auto& p : r.plans) n += std::count(p.begin(), p.end(), id);
    return n;
}

}  // namespace

TEST_CASE("grammar worker: a plain request's steps never wait for a 200-property schema's mask") {
    const auto g = props_grammar(200);
    const int64_t shortest = GrammarMatcher(g, byte_vocab()).min_remaining_tokens();
    REQUIRE(shortest > 1000);  // {"p0":"","p1":0,...}: one token per byte
    // Alone, the plain request (16 tokens) is sampled in 16 steps.
    int64_t alone = 0;
    {
        EngineCounters k;
        RankExecutor exec(PipelineLinks{}, k);
        MaskedRunner runner;
        EngineCore core(options(), exec, runner);
        std::map<int64_t, Output> out;
        core.add(request(16));
        for (int guard = 0; core.busy() && guard < 100; ++guard) absorb(out, core.step());
        alone = steps_with(runner, 0);
        REQUIRE(out[0].tokens.size() == 16);
    }
    EngineCounters k;
    RankExecutor exec(PipelineLinks{}, k);
    MaskedRunner runner;
    EngineCore core(options(), exec, runner);
    MaskWorker& masks = core.scheduler().mask_worker();
    masks.hold(true);  // the schema request's mask never finishes while the plain request runs
    const int64_t schema = core.add(request(shortest + 16, g));
    const int64_t plain = core.add(request(16));
    std::map<int64_t, Output> out;
    for (int guard = 0; out[plain].finish == FinishReason::kNone && guard < 100; ++guard) absorb(out, core.step());
    CHECK(out[plain].tokens.size() == 16);
    CHECK(out[plain].finish == FinishReason::kLength);
    CHECK(steps_with(runner, plain) == alone);
    CHECK(steps_with(runner, schema) == 0);  // sat every step out, its prompt's last token included
    CHECK(out[schema].tokens.empty());
    const MaskWorkerStats held = masks.stats();
    CHECK(held.inline_ == 0);  // no mask was computed on the scheduler's thread
    CHECK(held.computed == 0);
    CHECK(core.scheduler().stats().mask_skips >= int64_t(runner.plans.size()));
    // The waits are the stated bound per step (kMaskWaitMin_s here: the fake steps predict ~0 s), with
    // room for a loaded machine's wake-up latency; a mask computed in the step would be unbounded.
    CHECK(held.wait_s < double(runner.plans.size()) * 0.05);
    MESSAGE("plain request: " << steps_with(runner, plain) << " steps (alone " << alone << "), waited "
                              << held.wait_s * 1e3 << " ms for the held mask over " << runner.plans.size()
                              << " steps");
    // Released: the schema request runs to a well-formed document within its max_tokens.
    masks.hold(false);
    for (int guard = 0; core.busy() && guard < 10000; ++guard) absorb(out, core.step());
    const std::string doc = text_of(out[schema].tokens);
    CHECK(out[schema].finish == FinishReason::kStop);
    CHECK(int64_t(out[schema].tokens.size()) <= shortest + 16);
    const auto parsed = nlohmann::json::parse(doc, nullptr, false);
    REQUIRE(!parsed.is_discarded());
    CHECK(parsed.size() == 200);
    CHECK(masks.stats().inline_ == 0);
}

TEST_CASE("grammar worker: max_tokens at the shortest document ends well-formed through the worker") {
    const auto g = Grammar::compile({GrammarSpec::Kind::kJsonSchema,
                                     R"({"type":"object","properties":{"age":{"type":"integer"},
                                         "name":{"type":"string"}},"required":["age","name"]})",
                                     {}});
    const int64_t shortest = GrammarMatcher(g, byte_vocab()).min_remaining_tokens();
    for (int64_t slack : {0, 1, 5, 40}) {
        CAPTURE(slack);
        EngineCounters k;
        RankExecutor exec(PipelineLinks{}, k);
        MaskedRunner runner;
        EngineCore core(options(), exec, runner);
        std::map<int64_t, Output> out;
        for (int i = 0; i < 3; ++i) core.add(request(shortest + slack, g));
        for (int guard = 0; core.busy() && guard < 1000; ++guard) absorb(out, core.step());
        for (int64_t id = 0; id < 3; ++id) {
            const std::string doc = text_of(out[id].tokens);
            CAPTURE(doc);
            CHECK(int64_t(out[id].tokens.size()) <= shortest + slack);
            CHECK(!nlohmann::json::parse(doc, nullptr, false).is_discarded());
        }
        CHECK(core.scheduler().mask_worker().stats().inline_ == 0);
    }
}

TEST_CASE("grammar worker: the mask handed over is the matcher's; replaced or forgotten jobs are not") {
    const auto v = byte_vocab();
    const auto g = props_grammar(3);
    GrammarMatcher m(g, v);
    std::vector<uint32_t> want(9), got(9);
    MaskWorker w;
    w.request(7, 0, m, 1000);
    REQUIRE(m.accept_bytes("{\"p0\":\"a"));
    w.request(7, 5, m, 3);  // replaces generation 0 (near the end: the reserve's mask)
    mask_for(m, 3, want);
    w.take(7, 5, m, 3, got);
    CHECK(got == want);
    CHECK(w.stats().inline_ == 0);
    w.take(7, 0, m, 1000, got);  // generation 0 was replaced: computed here from the matcher given
    mask_for(m, 1000, want);
    CHECK(got == want);
    CHECK(w.stats().inline_ == 1);
    w.forget(7);
    CHECK(w.ready(7, 5, MaskWorker::Clock::now()));  // none left: take() computes it without waiting
}

}  // namespace test_grammar_worker
