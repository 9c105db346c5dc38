// Continuous batching over the paged KV cache on the golden models (one rank; test_layouts runs the
// same under mpirun): greedy outputs under any batching are the single-sequence outputs, token for
// token — 24 and 64 sequences of mixed prompt lengths, half added while the rest run, chunked
// prefill of 3 / 7 / 16 / 256 tokens per step, forced preemption (a KV cache of a few sequences),
// prefix-cache hits (shared prompt prefixes), a cap on running sequences. After every run every KV
// block is back in the pool. A request that can never fit the cache is refused at admission.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "tests/test_build.h"
#include "runtime/engine/client.h"
#include "runtime/builder/build.h"
#include "tests/runtime/model/golden.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

struct Case {
    std::vector<int32_t> prompt;
    int64_t n_new = 8;
};

// Golden prompts, random prompts of 1..40 tokens, and prompts sharing a 20-token prefix.
std::vector<Case> make_cases(const std::string& model, int64_t vocab, size_t count, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<Case> out;
    for (const GoldenCase& g : load_golden(model)) out.push_back(Case{g.prompt, 10});
    std::vector<int32_t> shared(20);
    for (auto& t : shared) t = int32_t(3 + rng() % uint64_t(vocab - 3));
    while (out.size() < count) {
        Case c;
        const int64_t len = 1 + int64_t(rng() % 40);
        if (out.size() % 3 == 0) c.prompt.assign(shared.begin(), shared.end());
        while (int64_t(c.prompt.size()) < len + (out.size() % 3 == 0 ? 20 : 0))
            c.prompt.push_back(int32_t(3 + rng() % uint64_t(vocab - 3)));
        c.n_new = 1 + int64_t(rng() % 12);
        out.push_back(std::move(c));
    }
    return out;
}

EngineRequest request(const Case& c) {
    EngineRequest r;
    r.prompt = c.prompt;
    r.max_new_tokens = c.n_new;
    r.ignore_eos = true;
    return r;
}

struct Run {
    std::vector<std::vector<int32_t>> tokens;
    SchedulerStats stats;
};

struct Config {
    const char* name;
    int64_t step_tokens = 256, block_size = 16, kv_blocks = 0, max_seqs = 64;
    bool prefix = true;
};

BuildOptions options(const Config& k) {
    BuildOptions opt = test::cpu_options();
    opt.model.block_size = k.block_size;
    opt.model.max_batch_tokens = 256;
    opt.micro_batch = k.step_tokens;
    opt.kv_blocks = k.kv_blocks;
    opt.engine.max_seqs = k.max_seqs;
    opt.engine.prefix_caching = k.prefix;
    return opt;
}

// Adds half of the cases (shuffled), then the rest one every other step while the first run.
Run run_batched(const TensorSource& src, const std::vector<Case>& cases, const Config& k, uint64_t seed) {
    RankRuntime rt = build(options(k), src);
    Engine& e = *rt.engine;
    std::vector<size_t> order(cases.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    std::map<int64_t, size_t> index;
    Run r;
    r.tokens.resize(cases.size());
    size_t next = 0;
    for (; next < cases.size() / 2; ++next) index[e.add(request(cases[order[next]]))] = order[next];
    int64_t steps = 0, finished = 0;
    while (e.busy() || next < cases.size()) {
        if (next < cases.size() && steps % 2 == 0) {
            index[e.add(request(cases[order[next]]))] = order[next];
            ++next;
        }
        for (const TokenEvent& ev : e.step()) {
            if (ev.token >= 0) r.tokens[index.at(ev.id)].push_back(ev.token);
            finished += ev.finish != FinishReason::kNone;
        }
        ++steps;
        REQUIRE(steps < 100000);
    }
    CHECK(finished == int64_t(cases.size()));
    const BlockPool& pool = e.scheduler().pool();
    CHECK_MESSAGE(pool.num_free() == pool.num_blocks(), "blocks still held after the run: " << pool.num_used());
    r.stats = e.scheduler().stats();
    return r;
}

std::vector<std::vector<int32_t>> run_single(const TensorSource& src, const std::vector<Case>& cases) {
    Config k{"single"};
    k.max_seqs = 1;
    k.prefix = false;
    RankRuntime rt = build(options(k), src);
    std::vector<std::vector<int32_t>> out;
    for (const Case& c : cases) {
        GenerateRequest g;
        g.prompt = c.prompt;
        g.max_new_tokens = c.n_new;
        g.ignore_eos = true;
        out.push_back(EngineClient(*rt.engine, nullptr, true).generate(g).tokens);
    }
    return out;
}

}  // namespace

TEST_CASE("golden models: every batching gives the single-sequence tokens; every block returns") {
    for (const std::string& model : golden_models()) {
        CAPTURE(model);
        auto src = open_model(golden_dir(model));
        const int64_t vocab = src->config().vocab;
        const std::vector<Case> cases = make_cases(model, vocab, 24, 17);
        const std::vector<std::vector<int32_t>> want = run_single(*src, cases);
        // The golden prompts reproduce the reference continuation.
        const auto golden = load_golden(model);
        for (size_t i = 0; i < golden.size(); ++i)
            CHECK(want[i] == std::vector<int32_t>(golden[i].greedy.begin(), golden[i].greedy.begin() + 10));
        int64_t most = 0;
        for (const Case& c : cases) most = std::max<int64_t>(most, int64_t(c.prompt.size()) + c.n_new);
        Config configs[] = {
            {"one step of 256 tokens"},
            {"chunks of 3, blocks of 4", 3, 4},
            {"steps of 64, a cache of ~1.5 sequences: preemption", 64, 4, (most + 3) / 4 + 8},
            {"chunks of 16, at most 5 running, no prefix cache", 16, 8, 0, 5, false},
        };
        for (const Config& k : configs) {
            CAPTURE(std::string(k.name));
            const Run r = run_batched(*src, cases, k, 5);
            for (size_t i = 0; i < cases.size(); ++i) {
                CAPTURE(i);
                CHECK(r.tokens[i] == want[i]);
            }
            if (k.kv_blocks > 0) CHECK(r.stats.preemptions > 0);
            if (k.prefix) CHECK(r.stats.cached_tokens > 0);
            CHECK(r.stats.generated_tokens == [&] {
                int64_t n = 0;
                for (const auto& w : want) n += int64_t(w.size());
                return n;
            }());
        }
    }
}

TEST_CASE("64 sequences at once on one golden model") {
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    const std::vector<Case> cases = make_cases("tiny-gqa-llama3", src->config().vocab, 64, 99);
    const auto want = run_single(*src, cases);
    Config k{"64 sequences, chunks of 32", 32, 16};
    const Run r = run_batched(*src, cases, k, 11);
    for (size_t i = 0; i < cases.size(); ++i) CHECK(r.tokens[i] == want[i]);
    CHECK(r.stats.peak_blocks > 0);
}

TEST_CASE("admission: a request the cache can never hold is refused with the numbers") {
    auto src = open_model(golden_dir("tiny-llama2"));
    Config k{"tiny cache", 256, 4, 3};
    RankRuntime rt = build(options(k), *src);
    EngineRequest r;
    r.prompt = std::vector<int32_t>(10, 5);
    r.max_new_tokens = 4;  // 14 positions = 4 blocks of 4 > 3
    std::string msg;
    try {
        rt.engine->add(r);
    } catch (const Error& e) {
        msg = e.what();
    }
    CHECK(msg.find("needs 4 KV blocks") != std::string::npos);
    CHECK(msg.find("holds 3") != std::string::npos);
    r.max_new_tokens = 2;  // 12 positions = 3 blocks: fits
    const int64_t id = rt.engine->add(r);
    int64_t got = 0;
    while (rt.engine->busy())
        for (const TokenEvent& ev : rt.engine->step()) got += ev.id == id && ev.token >= 0;
    CHECK(got == 2);
}

TEST_CASE("cancel frees a running sequence's blocks; min_tokens bans eos until reached") {
    auto src = open_model(golden_dir("tiny-llama2"));
    RankRuntime rt = build(options(Config{"cancel"}), *src);
    Engine& e = *rt.engine;
    EngineRequest r;
    r.prompt = load_golden("tiny-llama2")[0].prompt;
    r.max_new_tokens = 50;
    r.ignore_eos = true;
    const int64_t id = e.add(r);
    for (int i = 0; i < 3; ++i) e.step();
    CHECK(e.scheduler().pool().num_used() > 0);
    e.cancel(id);
    FinishReason why = FinishReason::kNone;
    while (e.busy())
        for (const TokenEvent& ev : e.step())
            if (ev.id == id && ev.finish != FinishReason::kNone) why = ev.finish;
    for (const TokenEvent& ev : e.step())
        if (ev.id == id && ev.finish != FinishReason::kNone) why = ev.finish;
    CHECK(why == FinishReason::kCancelled);
    CHECK(e.scheduler().pool().num_free() == e.scheduler().pool().num_blocks());
    // min_tokens: the greedy continuation's own tokens as stop ids cannot end it early.
    const std::vector<int32_t> greedy = load_golden("tiny-llama2")[0].greedy;
    EngineRequest m;
    m.prompt = r.prompt;
    m.max_new_tokens = 6;
    m.min_tokens = 4;
    m.stop_ids = {greedy[0], greedy[1]};
    const int64_t mid = e.add(m);
    std::vector<int32_t> out;
    while (e.busy())
        for (const TokenEvent& ev : e.step())
            if (ev.id == mid && ev.token >= 0) out.push_back(ev.token);
    REQUIRE(out.size() >= 4);
    for (size_t i = 0; i < 4; ++i) CHECK(out[i] != greedy[0]);
    for (size_t i = 0; i < 4; ++i) CHECK(out[i] != greedy[1]);
}
