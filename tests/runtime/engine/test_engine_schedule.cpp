// The engine's every-rank conveniences on one rank (the multi-rank schedule is test_layouts under
// mpirun; batching and paging are test_engine_batching): prompt chunking changes nothing; the
// context bounds the new tokens; stop ids end a sequence (and are returned), ignore_eos does not
// stop; max_new_tokens 0 yields nothing; a batch of sequences of different lengths equals the
// sequences run one by one; stats count what ran; score() returns the logits of every position.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tests/test_build.h"
#include "runtime/engine/client.h"
#include "runtime/builder/build.h"
#include "runtime/weights/random_source.h"

using namespace lattice;

namespace {

ModelConfig tiny() { return test::tiny_config("tiny random (test_engine_schedule)"); }

RankRuntime make(const TensorSource& src, int64_t micro = 0, int64_t max_seq = 0) {
    BuildOptions opt = test::cpu_options();
    opt.model.max_seq = max_seq;
    opt.micro_batch = micro;
    return build(opt, src);
}

GenerateRequest req(std::vector<int32_t> prompt, int64_t n, bool ignore_eos = true, std::vector<int32_t> stop = {}) {
    GenerateRequest r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = n;
    r.ignore_eos = ignore_eos;
    r.stop_ids = std::move(stop);
    return r;
}

}  // namespace

TEST_CASE("prompt chunks of any size give the same tokens and logits") {
    auto src = make_random_source(tiny(), 3, DType::kF32);
    const std::vector<int32_t> prompt = {5, 9, 33, 17, 1, 60, 44, 12, 8};
    RankRuntime whole = make(*src);
    const auto want = EngineClient(*whole.engine, nullptr, true).generate(req(prompt, 10)).tokens;
    const auto want_logits = EngineClient(*whole.engine, nullptr, true).score(prompt);
    REQUIRE(want.size() == 10);
    for (int64_t micro : {1, 2, 4}) {
        CAPTURE(micro);
        RankRuntime rt = make(*src, micro);
        CHECK(EngineClient(*rt.engine, nullptr, true).generate(req(prompt, 10)).tokens == want);
        const auto logits = EngineClient(*rt.engine, nullptr, true).score(prompt);
        REQUIRE(logits.size() == want_logits.size());
        for (size_t i = 0; i < logits.size(); ++i) CHECK(std::abs(logits[i] - want_logits[i]) < 1e-4f);
    }
}

TEST_CASE("the context bounds the new tokens; max_new_tokens 0 yields none") {
    auto src = make_random_source(tiny(), 4, DType::kF32);
    RankRuntime rt = make(*src, 0, 12);
    const GenerateResult full = EngineClient(*rt.engine, nullptr, true).generate(req({1, 2, 3, 4, 5}, 100));
    CHECK(full.tokens.size() == 7);  // 12 positions - 5 prompt
    CHECK(full.finish == FinishReason::kLength);
    const GenerateResult none = EngineClient(*rt.engine, nullptr, true).generate(req({1, 2, 3, 4, 5}, 0));
    CHECK(none.tokens.empty());
    CHECK(none.finish == FinishReason::kLength);
    CHECK(EngineClient(*rt.engine, nullptr, true).generate(req(std::vector<int32_t>(12, 7), 5)).finish == FinishReason::kLength);
    CHECK_THROWS_AS(EngineClient(*rt.engine, nullptr, true).generate(req(std::vector<int32_t>(13, 7), 1)), Error);  // prompt beyond the cache
    CHECK_THROWS_AS(EngineClient(*rt.engine, nullptr, true).generate(req({}, 1)), Error);
    CHECK_THROWS_AS(EngineClient(*rt.engine, nullptr, true).generate(req({61}, 1)), Error);  // outside the vocab
}

TEST_CASE("stop ids and eos end a sequence and are returned; ignore_eos runs on") {
    ModelConfig c = tiny();
    auto src = make_random_source(c, 5, DType::kF32);
    RankRuntime rt = make(*src);
    const std::vector<int32_t> prompt = {7, 21, 3};
    const auto free_run = EngineClient(*rt.engine, nullptr, true).generate(req(prompt, 12)).tokens;  // ignores eos and stop ids
    REQUIRE(free_run.size() == 12);
    // Cut at the first token that is the stop id or the config's eos, that token included.
    auto cut = [&](int32_t stop) {
        for (size_t i = 0; i < free_run.size(); ++i)
            if (free_run[i] == stop || c.is_eos(free_run[i]))
                return std::vector<int32_t>(free_run.begin(), free_run.begin() + ptrdiff_t(i) + 1);
        return free_run;
    };
    for (size_t k : {size_t(0), size_t(4), size_t(11)}) {
        CAPTURE(k);
        const int32_t stop = free_run[k];
        const GenerateResult r = EngineClient(*rt.engine, nullptr, true).generate(req(prompt, 12, false, {stop}));
        CHECK(r.tokens == cut(stop));
        const bool stopped = c.is_eos(r.tokens.back()) || r.tokens.back() == stop;
        CHECK(r.finish == (stopped ? FinishReason::kStop : FinishReason::kLength));
        // ignore_eos lets the model's eos pass; the stop id still ends the sequence.
        std::vector<int32_t> to_stop = free_run;
        to_stop.resize(size_t(std::find(free_run.begin(), free_run.end(), stop) - free_run.begin()) + 1);
        CHECK(EngineClient(*rt.engine, nullptr, true).generate(req(prompt, 12, true, {stop})).tokens == to_stop);
    }
    // The config's eos alone: a model whose eos is the third free-run token stops there.
    c.eos_ids = {free_run[2]};
    auto src2 = make_random_source(c, 5, DType::kF32);
    RankRuntime b2 = make(*src2);
    CHECK(EngineClient(*b2.engine, nullptr, true).generate(req(prompt, 12, false)).tokens == cut(-1));
    CHECK(cut(-1).size() <= 3);
}

TEST_CASE("a batch of sequences equals the sequences one by one; stats count what ran") {
    auto src = make_random_source(tiny(), 6, DType::kF32);
    RankRuntime rt = make(*src, 3);
    const std::vector<GenerateRequest> reqs = {req({1, 2, 3, 4, 5, 6, 7}, 9), req({40}, 5), req({11, 12, 13}, 0),
                                               req({9, 8, 7, 6}, 12)};
    std::vector<std::vector<int32_t>> want;
    for (const auto& r : reqs) want.push_back(EngineClient(*rt.engine, nullptr, true).generate(r).tokens);
    GenerateStats st;
    const auto got = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, {}, &st);
    REQUIRE(got.size() == reqs.size());
    int64_t generated = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        CHECK(got[i].tokens == want[i]);
        generated += int64_t(want[i].size());
    }
    CHECK(st.sequences == 4);
    CHECK(st.generated_tokens == generated);
    CHECK(st.prompt_tokens == 7 + 1 + 4);  // a sequence with nothing to generate is not prefilled
    CHECK(st.compute_seconds > 0);
    // A failed request leaves the engine usable: nothing of the batch ran.
    std::vector<GenerateRequest> bad = {req({1, 2}, 2), req({70}, 2)};
    CHECK_THROWS_AS(EngineClient(*rt.engine, nullptr, true).generate_batch(bad), Error);
    CHECK(EngineClient(*rt.engine, nullptr, true).generate_batch(reqs)[0].tokens == want[0]);
}

TEST_CASE("score: the logits of every prompt position, each the next-token distribution") {
    auto src = make_random_source(tiny(), 7, DType::kF32);
    RankRuntime rt = make(*src);
    const std::vector<int32_t> prompt = {3, 14, 15, 9, 26};
    const auto logits = EngineClient(*rt.engine, nullptr, true).score(prompt);
    REQUIRE(logits.size() == prompt.size() * 61);
    // The greedy next token after the whole prompt is the argmax of the last row.
    const float* last = logits.data() + (prompt.size() - 1) * 61;
    const int32_t next = int32_t(std::max_element(last, last + 61) - last);
    CHECK(EngineClient(*rt.engine, nullptr, true).generate(req(prompt, 1)).tokens == std::vector<int32_t>{next});
    // Row i is the distribution after the prefix [0, i]: scoring the prefix alone gives the same row.
    const auto prefix = EngineClient(*rt.engine, nullptr, true).score({3, 14, 15});
    for (size_t j = 0; j < 3 * 61; ++j) CHECK(std::abs(prefix[j] - logits[j]) < 1e-5f);
}
