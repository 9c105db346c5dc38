// The engine client (runtime/engine/client.h) and its text rules (TextStream through RequestOutput),
// on one rank:
//  - text: a stop string across token boundaries cuts the output before it, nothing after it is
//    shown, a possible stop-string start is held back until it cannot be one, a cancel flushes it;
//    the token that ended a request by kStop is returned but not shown; usage and context_full;
//  - the client on a tiny random model: run() gives the engine's own tokens; the context budget
//    (rest of context, clamp, no room, 0 tokens); cancel and drain end requests as kCancelled once;
//    stop_token_ids stop; ignore_eos lets the model's eos pass; top logprobs reach the client's outputs;
//  - requests of several choices: events by choice, siblings deferred to their first's first token (and
//    served by the prefix cache), one last event with the request's usage, all-or-nothing refusal,
//    cancel and drain ending every choice once; prompt logprobs against the score path's logits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/builder/build.h"
#include "runtime/engine/client.h"
#include "runtime/weights/random_source.h"
#include "tests/test_build.h"
#include "tests/test_paths.h"

using namespace lattice;

namespace {

const Tokenizer& llama2() {
    static const std::unique_ptr<Tokenizer> tok = load_tokenizer(test::shared_file("tokenizers/llama2-tokenizer.model"));
    return *tok;
}

// Feeds `ids` as engine events (the last one with `last`), collecting the client events.
std::vector<ClientEvent> feed(RequestOutput& out, const std::vector<int32_t>& ids, FinishReason last) {
    std::vector<ClientEvent> evs;
    for (size_t i = 0; i < ids.size(); ++i) {
        evs.push_back(out.apply(TokenEvent{7, ids[i], -0.5f, i + 1 == ids.size() ? last : FinishReason::kNone}));
        if (evs.back().finish != FinishReason::kNone) break;
    }
    return evs;
}

std::string joined(const std::vector<ClientEvent>& evs) {
    std::string s;
    for (const ClientEvent& e : evs) s += e.text;
    return s;
}

}  // namespace

TEST_CASE("request output: stop strings across tokens, held-back text, hidden stop tokens, usage") {
    const Tokenizer& tok = llama2();
    const std::vector<int32_t> ids = tok.encode("Hello world. The end of it", false, false);
    REQUIRE(ids.size() >= 6);
    SUBCASE("no stop string: the whole decoded text, usage on the last event") {
        RequestOutput out(&tok, {}, 3, 1000);
        const auto evs = feed(out, ids, FinishReason::kLength);
        CHECK(joined(evs) == tok.decode(ids, false));
        CHECK(evs.back().finish == FinishReason::kLength);
        CHECK(evs.back().prompt_tokens == 3);
        CHECK(evs.back().completion_tokens == int64_t(ids.size()));
        CHECK_FALSE(evs.back().context_full);
        CHECK(evs.back().logprob == -0.5f);
    }
    SUBCASE("a stop string spanning tokens ends the output before it") {
        RequestOutput out(&tok, {"ld. Th"}, 3, 1000);
        const auto evs = feed(out, ids, FinishReason::kNone);
        REQUIRE(evs.back().finish == FinishReason::kStop);
        CHECK(out.stopped_by_text());
        CHECK(joined(evs) == "Hello wor");
        CHECK(out.text() == "Hello wor");
        CHECK(evs.size() < ids.size());  // it ended early: nothing after the stop string
        CHECK(evs.back().completion_tokens == int64_t(evs.size()));
    }
    SUBCASE("text that may begin a stop string is held back; a cancel flushes it") {
        RequestOutput out(&tok, {"end!"}, 3, 1000);
        const auto evs = feed(out, ids, FinishReason::kNone);
        CHECK(evs.back().finish == FinishReason::kNone);
        CHECK(joined(evs) == tok.decode(ids, false));  // "end" is shown once " of" shows it is not "end!" ...
        const std::vector<int32_t> upto_end = tok.encode("Hello world. The end", false, false);
        RequestOutput held(&tok, {"end!"}, 3, 1000);
        const auto part = feed(held, upto_end, FinishReason::kNone);
        CHECK(joined(part).ends_with("The "));  // ... but not while it still could be
        const ClientEvent last = held.cancel(7, false);
        CHECK(last.finish == FinishReason::kCancelled);
        CHECK(last.text == "end");
        CHECK(joined(part) + last.text == "Hello world. The end");
    }
    SUBCASE("the token that stops (eos) is returned, not shown; a full context says so") {
        RequestOutput out(&tok, {}, 4, 4 + int64_t(ids.size()) + 1);
        std::vector<int32_t> with_eos = ids;
        with_eos.push_back(tok.eos_id());
        const auto evs = feed(out, with_eos, FinishReason::kStop);
        CHECK(evs.back().token == tok.eos_id());
        CHECK(evs.back().text.empty());
        CHECK(joined(evs) == tok.decode(ids, false));
        RequestOutput full(&tok, {}, 4, 4 + int64_t(ids.size()));
        CHECK(feed(full, ids, FinishReason::kLength).back().context_full);
    }
    SUBCASE("without a tokenizer: ids, no text") {
        RequestOutput out(nullptr, {}, 2, 100);
        const auto evs = feed(out, ids, FinishReason::kLength);
        CHECK(joined(evs).empty());
        CHECK(evs.back().completion_tokens == int64_t(ids.size()));
    }
}

namespace {

ModelConfig tiny() { return test::tiny_config("tiny random (test_client)"); }

RankRuntime make(const TensorSource& src, int64_t max_seq = 24, int64_t kv_blocks = 0) {
    BuildOptions o = test::cpu_options();
    o.model.max_seq = max_seq;
    o.kv_blocks = kv_blocks;
    return build(o, src);
}

ClientRequest request(std::vector<int32_t> prompt, int64_t n) {
    ClientRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = n;
    r.ignore_eos = true;
    return r;
}

// Polls until the client is idle; the events by id.
std::map<int64_t, std::vector<ClientEvent>> drain_events(EngineClient& c) {
    std::map<int64_t, std::vector<ClientEvent>> by_id;
    while (c.busy())
        for (ClientEvent& e : c.poll()) by_id[e.id].push_back(std::move(e));
    return by_id;
}

}  // namespace

TEST_CASE("engine client: the engine's tokens, the context budget, cancel, drain, stops") {
    auto src = make_random_source(tiny(), 11, DType::kF32);
    RankRuntime b = make(*src);
    EngineClient client(*b.engine, nullptr);
    REQUIRE(client.context() == 24);
    const std::vector<int32_t> prompt = {5, 9, 33, 17};
    GenerateRequest g;
    g.prompt = prompt;
    g.max_new_tokens = 8;
    g.ignore_eos = true;
    const std::vector<int32_t> want = EngineClient(*b.engine, nullptr, true).generate(g).tokens;
    REQUIRE(want.size() == 8);

    SUBCASE("run() returns the engine's tokens, logprobs and finish") {
        GenerateStats stats;
        const auto outs = client.run({request(prompt, 8)}, {}, &stats);
        REQUIRE(outs.size() == 1);
        CHECK(outs[0].tokens == want);
        CHECK(outs[0].logprobs.size() == want.size());
        CHECK(outs[0].finish == FinishReason::kLength);
        CHECK_FALSE(outs[0].context_full);
        CHECK(stats.generated_tokens == 8);
        // on_event returning false cancels: the output ends there as cancelled.
        const auto cut = client.run({request(prompt, 8)}, [](size_t, const ClientEvent& e) { return e.token < 0; });
        CHECK(cut[0].finish == FinishReason::kCancelled);
        CHECK(cut[0].tokens == std::vector<int32_t>(want.begin(), want.begin() + 1));
    }
    SUBCASE("top logprobs: k per token, the greedy token first with its own logprob; none unless asked") {
        ClientRequest r = request(prompt, 8);
        r.sampling.logprobs = 3;
        const auto outs = client.run({r, request(prompt, 8)});
        CHECK(outs[0].tokens == want);
        REQUIRE(outs[0].top.size() == want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            REQUIRE(outs[0].top[i].size() == 3);
            CHECK(outs[0].top[i][0].token == want[i]);
            CHECK(outs[0].top[i][0].logprob == outs[0].logprobs[i]);
            CHECK(outs[0].top[i][1].logprob <= outs[0].top[i][0].logprob);
            CHECK(outs[0].top[i][2].logprob <= outs[0].top[i][1].logprob);
        }
        CHECK(outs[1].top.empty());
        CHECK(outs[1].logprobs == outs[0].logprobs);
    }
    SUBCASE("a KV cache smaller than the context bounds it: the rest of the context fits the cache") {
        RankRuntime small = make(*src, 24, 1);  // one block of 16 positions
        EngineClient c(*small.engine, nullptr);
        CHECK(c.context() == 16);
        const auto outs = c.run({request(prompt, ClientRequest::kRestOfContext)});
        CHECK(outs[0].tokens.size() == 12);
        CHECK(outs[0].context_full);
    }
    SUBCASE("budget: the rest of the context, a clamp, no room, zero") {
        CHECK(client.budget(4, ClientRequest::kRestOfContext) == 20);
        CHECK(client.budget(4, 100) == 20);
        CHECK(client.budget(4, 3) == 3);
        CHECK(client.budget(24, 0) == 0);
        CHECK_THROWS_WITH_AS(client.budget(24, 1), doctest::Contains("fills the whole context of 24"), Error);
        CHECK_THROWS_WITH_AS(client.budget(25, 1), doctest::Contains("longer than the model's context"), Error);
        const auto outs = client.run({request(prompt, ClientRequest::kRestOfContext)});
        CHECK(outs[0].tokens.size() == 20);
        CHECK(outs[0].finish == FinishReason::kLength);
        CHECK(outs[0].context_full);
        CHECK(outs[0].max_tokens == 20);
        CHECK_THROWS_AS(client.run({request(std::vector<int32_t>(24, 3), 1)}), Error);
        CHECK(client.run({request(prompt, 1)})[0].tokens.size() == 1);  // usable after a refusal
    }
    SUBCASE("cancel ends a request once, as cancelled; the others run on") {
        const int64_t a = client.submit(request(prompt, 8));
        const int64_t c = client.submit(request(prompt, 8));
        std::vector<ClientEvent> first = client.poll();
        client.cancel(a);
        client.cancel(a);  // twice: one last event
        auto rest = drain_events(client);
        for (const ClientEvent& e : first) rest[e.id].insert(rest[e.id].begin(), e);
        REQUIRE(!rest[a].empty());
        CHECK(rest[a].back().finish == FinishReason::kCancelled);
        CHECK_FALSE(rest[a].back().drained);
        int64_t finishes = 0;
        for (const ClientEvent& e : rest[a]) finishes += e.finish != FinishReason::kNone;
        CHECK(finishes == 1);
        CHECK(rest[c].size() == 8);
        CHECK(rest[c].back().finish == FinishReason::kLength);
        client.shutdown();
    }
    SUBCASE("drain: no new requests; at the deadline the running end as drained") {
        const int64_t a = client.submit(request(prompt, 8));
        client.drain(0);
        CHECK_THROWS_AS(client.submit(request(prompt, 8)), Error);
        auto evs = drain_events(client);
        REQUIRE(evs.count(a));
        CHECK(evs[a].back().finish == FinishReason::kCancelled);
        CHECK(evs[a].back().drained);
        CHECK(client.active() == 0);
        client.shutdown();
    }
    SUBCASE("stop_token_ids stop (the id returned); the model's eos stops unless ignore_eos") {
        ClientRequest r = request(prompt, 8);
        r.stop_token_ids = {want[3]};
        const auto outs = client.run({r});
        const size_t first = size_t(std::find(want.begin(), want.end(), want[3]) - want.begin());
        CHECK(outs[0].tokens == std::vector<int32_t>(want.begin(), want.begin() + ptrdiff_t(first) + 1));
        CHECK(outs[0].finish == FinishReason::kStop);
        ModelConfig c = tiny();
        c.eos_ids = {want[2]};
        auto eos_src = make_random_source(c, 11, DType::kF32);
        RankRuntime e = make(*eos_src);
        EngineClient ec(*e.engine, nullptr);
        ClientRequest stops = request(prompt, 8);
        stops.ignore_eos = false;
        const size_t at = size_t(std::find(want.begin(), want.end(), want[2]) - want.begin());
        CHECK(ec.run({stops})[0].tokens.size() == at + 1);
        CHECK(ec.run({request(prompt, 8)})[0].tokens == want);
    }
}

TEST_CASE("engine client: a request of several choices (n / best_of, lists of prompts), prompt logprobs") {
    auto src = make_random_source(tiny(), 11, DType::kF32);
    RankRuntime b = make(*src, 48);
    EngineClient client(*b.engine, nullptr);
    // Two prompts, each with one full KV block (16 positions) that its siblings can find cached.
    std::vector<int32_t> p0(20), p1(18);
    for (size_t i = 0; i < p0.size(); ++i) p0[i] = int32_t(1 + (i * 7) % 60);
    for (size_t i = 0; i < p1.size(); ++i) p1[i] = int32_t(2 + (i * 11) % 60);
    const auto group = [&](int64_t max_tokens) {
        std::vector<ClientRequest> choices;
        for (const auto* p : {&p0, &p1})
            for (int i = 0; i < 3; ++i) choices.push_back(request(*p, max_tokens));
        return choices;
    };
    // Every choice ends once (kCancelled when `cancelled`); the request's last event alone is marked.
    const auto check_ends = [](const std::vector<ClientEvent>& evs, FinishReason want) {
        std::vector<int> ends(6, 0);
        for (size_t i = 0; i < evs.size(); ++i) {
            REQUIRE(evs[i].index >= 0);
            REQUIRE(evs[i].index < 6);
            if (evs[i].finish != FinishReason::kNone) {
                ++ends[size_t(evs[i].index)];
                CHECK(evs[i].finish == want);
            }
            CHECK(evs[i].last_of_request == (i + 1 == evs.size()));
        }
        CHECK(ends == std::vector<int>(6, 1));
    };

    SUBCASE("choices by index; siblings start once their first has a token, and find its prompt cached") {
        const int64_t id = client.submit(group(4), 3);
        CHECK(client.scheduler().waiting() == 2);  // the first choice of each prompt only
        auto evs = drain_events(client);
        REQUIRE(evs.size() == 1);
        const std::vector<ClientEvent>& e = evs[id];
        check_ends(e, FinishReason::kLength);
        CHECK(e.back().request_prompt_tokens == 38);  // each prompt once
        CHECK(e.back().request_completion_tokens == 24);
        CHECK(client.scheduler().stats().cached_tokens == 4 * 16);  // 2 siblings x 2 prompts x 1 block
        std::vector<std::vector<int32_t>> got(6);
        for (const ClientEvent& x : e)
            if (x.token >= 0) got[size_t(x.index)].push_back(x.token);
        const std::vector<int32_t> want0 = client.run({request(p0, 4)})[0].tokens;
        const std::vector<int32_t> want1 = client.run({request(p1, 4)})[0].tokens;
        REQUIRE(want0.size() == 4);
        for (size_t i = 0; i < 6; ++i) CHECK(got[i] == (i < 3 ? want0 : want1));  // greedy: every sibling alike
        CHECK(client.active() == 0);
    }
    SUBCASE("a refused choice refuses the request: nothing runs, nothing is left") {
        std::vector<ClientRequest> choices = group(4);
        choices[4].prompt.assign(48, 3);  // fills the context: no room
        CHECK_THROWS_WITH_AS(client.submit(std::move(choices), 3), doctest::Contains("fills the whole context"), Error);
        CHECK(client.active() == 0);
        CHECK(client.scheduler().waiting() == 0);
        CHECK_FALSE(client.busy());
        CHECK_THROWS_AS(client.submit(group(4), 4), Error);  // 6 choices are not runs of 4
    }
    SUBCASE("cancel ends every choice once, the ones that never ran too") {
        const int64_t id = client.submit(group(4), 3);
        client.poll();  // the first choices have their first tokens: some siblings run
        client.cancel(id);
        client.cancel(id);
        auto evs = drain_events(client);
        REQUIRE(evs.count(id));
        std::vector<ClientEvent>& e = evs[id];
        // Drop the tokens of the first poll's events (none was kept above): only the ends matter here.
        e.erase(
            std::remove_if(e.begin(), e.end(), [](const ClientEvent& x) { return x.finish == FinishReason::kNone; }),
            e.end());
        check_ends(e, FinishReason::kCancelled);
        CHECK(client.active() == 0);
        CHECK(client.scheduler().pool().num_used() == 0);
        client.shutdown();
    }
    SUBCASE("a drain's deadline ends every choice as drained") {
        const int64_t id = client.submit(group(8), 3);
        client.drain(0);
        auto evs = drain_events(client);
        check_ends(evs[id], FinishReason::kCancelled);
        for (const ClientEvent& x : evs[id])
            if (x.finish != FinishReason::kNone) CHECK(x.drained);
        CHECK(client.active() == 0);
        client.shutdown();
    }
    SUBCASE("prompt logprobs: each token's log-softmax given the ones before, and the k most likely") {
        const std::vector<float> logits = client.score(p0);
        const size_t V = logits.size() / p0.size();
        const PromptLogprobs lp = client.prompt_logprobs(p0, 2);
        REQUIRE(lp.logprobs.size() == p0.size());
        REQUIRE(lp.top.size() == p0.size());
        CHECK(std::isnan(lp.logprobs[0]));
        CHECK(lp.top[0].empty());
        for (size_t i = 1; i < p0.size(); ++i) {
            const float* row = logits.data() + (i - 1) * V;
            double m = row[0], z = 0;
            for (size_t v = 0; v < V; ++v) m = std::max(m, double(row[v]));
            for (size_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - m);
            CHECK(lp.logprobs[i] == doctest::Approx(double(row[p0[i]]) - m - std::log(z)).epsilon(1e-5));
            REQUIRE(lp.top[i].size() == 2);
            CHECK(lp.top[i][0].token == int32_t(std::max_element(row, row + V) - row));
            CHECK(lp.top[i][1].logprob <= lp.top[i][0].logprob);
        }
        CHECK(client.prompt_logprobs(p0, -1).top.empty());
    }
}
