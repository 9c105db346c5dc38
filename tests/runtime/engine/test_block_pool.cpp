// BlockPool (runtime/engine/block_pool.h): allocation all-or-nothing, reference counts, release
// errors, least-recently-freed reuse, and the prefix cache: a cached full block is found only for
// the same tokens after the same parent, revived from the free list, shared with a count, and
// forgotten once its block is reallocated; a released prefix is evicted tail first (its head stays
// findable longest). The scheduler's step budget bounds prompt tokens, not how many sequences decode;
// with a pipeline the steps in flight share the decodes evenly and each takes a prompt chunk.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <span>
#include <vector>

#include "base/error.h"
#include "runtime/engine/block_pool.h"
#include "runtime/engine/scheduler.h"

using namespace lattice;

TEST_CASE("allocate is all or nothing; release returns blocks; double release is an error") {
    BlockPool p(5, 4, false);
    CHECK(p.num_free() == 5);
    std::vector<int32_t> a;
    CHECK(p.allocate(3, a));
    CHECK(a.size() == 3);
    CHECK(p.num_used() == 3);
    std::vector<int32_t> b;
    CHECK_FALSE(p.allocate(3, b));
    CHECK(b.empty());
    CHECK(p.num_free() == 2);
    p.release(a);
    CHECK(p.num_free() == 5);
    CHECK_THROWS_AS(p.release(a), Error);
    CHECK_THROWS_AS(BlockPool(0, 4, false), Error);
    CHECK_THROWS_AS(BlockPool(4, 0, false), Error);
}

TEST_CASE("freed blocks are reused least recently freed first") {
    BlockPool p(3, 2, false);
    std::vector<int32_t> a;
    REQUIRE(p.allocate(3, a));
    p.release(std::vector<int32_t>{a[2]});
    p.release(std::vector<int32_t>{a[0]});
    std::vector<int32_t> b;
    REQUIRE(p.allocate(1, b));
    CHECK(b[0] == a[2]);
}

TEST_CASE("prefix cache: found for the same tokens after the same parent, shared, revived, forgotten on reuse") {
    BlockPool p(4, 2, true);
    const std::vector<int32_t> t0 = {1, 2}, t1 = {3, 4}, other = {3, 5};
    std::vector<int32_t> seq;
    REQUIRE(p.allocate(2, seq));
    const uint64_t h0 = BlockPool::chain_hash(0, t0), h1 = BlockPool::chain_hash(h0, t1);
    CHECK(h1 != BlockPool::chain_hash(0, t1));  // the chain makes position part of the key
    p.register_full(seq[0], h0, -1, t0);
    p.register_full(seq[1], h1, seq[0], t1);
    // Live hit: shared with a second reference.
    const int32_t hit = p.lookup(h0, -1, t0);
    CHECK(hit == seq[0]);
    CHECK(p.cache_hits() == 1);
    CHECK(p.lookup(BlockPool::chain_hash(h0, other), seq[0], other) == -1);  // other tokens
    CHECK(p.lookup(h1, seq[1], t1) == -1);                                   // wrong parent
    CHECK(p.lookup(h1, seq[0], other) == -1);                                // same hash, other tokens
    p.release(std::vector<int32_t>{hit});
    p.release(seq);
    CHECK(p.num_free() == 4);
    // Revived from the free list.
    const int32_t again = p.lookup(h0, -1, t0);
    CHECK(again == seq[0]);
    CHECK(p.num_free() == 3);
    p.release(std::vector<int32_t>{again});
    // Reallocating every block evicts the cached ones: the entry is gone.
    std::vector<int32_t> all;
    REQUIRE(p.allocate(4, all));
    p.release(all);
    CHECK(p.lookup(h0, -1, t0) == -1);
    CHECK(p.num_free() == 4);
}

TEST_CASE("prefix cache: unrelated allocations evict a released prefix from its tail; its head stays findable") {
    // 13 tokens in blocks of 4: three full (cacheable) blocks and a partial one, in a pool of 8.
    std::vector<int32_t> prompt(13);
    for (int i = 0; i < 13; ++i) prompt[size_t(i)] = 100 + i;
    auto span_of = [&](int k) { return std::span<const int32_t>(prompt.data() + 4 * k, 4); };
    std::vector<uint64_t> hashes;
    for (int k = 0; k < 3; ++k) hashes.push_back(BlockPool::chain_hash(k == 0 ? 0 : hashes.back(), span_of(k)));
    // The prompt's tokens cached, its blocks released, then `unrelated` blocks allocated; returns the
    // cached tokens a repeat of the prompt finds, walking the chain from its head as the scheduler does.
    auto found_after = [&](int64_t unrelated) {
        BlockPool p(8, 4, true);
        std::vector<int32_t> seq, other, got;
        REQUIRE(p.allocate(4, seq));
        for (int k = 0; k < 3; ++k) p.register_full(seq[size_t(k)], hashes[size_t(k)], k == 0 ? -1 : seq[size_t(k - 1)], span_of(k));
        p.release(seq);
        REQUIRE(p.allocate(unrelated, other));
        int32_t parent = -1;
        for (int k = 0; k < 3; ++k) {
            const int32_t b = p.lookup(hashes[size_t(k)], parent, span_of(k));
            if (b < 0) break;
            got.push_back(b);
            parent = b;
        }
        p.release(got);
        p.release(other);
        CHECK(p.num_free() == 8);
        return int64_t(got.size()) * 4;
    };
    CHECK(found_after(0) == 12);
    CHECK(found_after(5) == 12);  // the 4 never-used blocks, then the partial one (it held no prefix)
    CHECK(found_after(6) == 8);   // then the tail block: the head two remain
    CHECK(found_after(7) == 4);
    CHECK(found_after(8) == 0);
}

TEST_CASE("without prefix caching nothing is cached") {
    BlockPool p(2, 2, false);
    std::vector<int32_t> a;
    REQUIRE(p.allocate(1, a));
    const std::vector<int32_t> t = {7, 8};
    p.register_full(a[0], BlockPool::chain_hash(0, t), -1, t);
    CHECK(p.lookup(BlockPool::chain_hash(0, t), -1, t) == -1);
}

TEST_CASE("scheduler: a prompt budget below max_seqs bounds the chunks, not how many sequences decode per step") {
    // 8 sequences, a budget of 4 prompt tokens per step, room for all 8 decodes beside it.
    BlockPool pool(64, 4, false);
    SchedulerOptions o;
    o.step_tokens = 4;
    o.step_capacity = 4 + 8;
    o.max_seqs = 8;
    o.max_seq = 64;
    o.vocab = 100;
    Scheduler sched(o, pool);
    for (int i = 0; i < 8; ++i) {
        EngineRequest r;
        r.prompt = {1, 2, 3};
        r.max_new_tokens = 20;
        r.ignore_eos = true;
        sched.add(r);
    }
    int64_t most_decodes = 0, most_prompt = 0;
    for (int64_t step = 1; step <= 40 && !sched.idle(); ++step) {
        const StepPlan p = sched.next(step);
        int64_t decodes = 0, prompt = 0, sampled = 0;
        for (const PlanSeq& s : p.seqs) {
            const bool decode = s.count == 1 && s.start >= 3;
            decodes += decode;
            prompt += decode ? 0 : s.count;
            sampled += s.sample;
        }
        CHECK(prompt <= 4);                // the budget bounds the prompt tokens of a step ...
        CHECK(decodes + prompt <= 4 + 8);  // ... and the step stays within its capacity
        most_decodes = std::max(most_decodes, decodes);
        most_prompt = std::max(most_prompt, prompt);
        std::vector<SampledToken> tokens(size_t(sampled), SampledToken{7, -1.0f});
        sched.complete(p, tokens);
        sched.take_finished();
    }
    CHECK(most_decodes == 8);  // ... but every running sequence decodes in one step (it used to be 4)
    CHECK(most_prompt == 4);
    CHECK(sched.idle());
    CHECK(pool.num_free() == 64);
}

TEST_CASE("scheduler: lower priority values run first, arrival order within a level; the first token says its queue time") {
    BlockPool pool(32, 4, false);
    SchedulerOptions o;
    o.step_tokens = 64;
    o.max_seqs = 1;  // one at a time: the order of admission is the order of the runs
    o.max_seq = 64;
    o.vocab = 100;
    Scheduler sched(o, pool);
    const std::vector<int64_t> priorities = {0, 5, -1, 0, 5};  // ids 0..4
    for (int64_t prio : priorities) {
        EngineRequest r;
        r.prompt = {1, 2};
        r.max_new_tokens = 2;
        r.ignore_eos = true;
        r.priority = prio;
        sched.add(r);
    }
    std::vector<int64_t> started;
    int64_t first_tokens = 0;
    for (int64_t step = 1; step <= 40 && !sched.idle(); ++step) {
        const StepPlan p = sched.next(step);
        int64_t sampled = 0;
        for (const PlanSeq& s : p.seqs) {
            if (s.start == 0) started.push_back(s.id);
            sampled += s.sample;
        }
        const std::vector<SampledToken> tokens(size_t(sampled), SampledToken{7, -1.0f});
        for (const TokenEvent& ev : sched.complete(p, tokens)) {
            if (ev.token < 0) continue;
            if (ev.queue_seconds >= 0) ++first_tokens;
        }
        sched.take_finished();
    }
    CHECK(started == std::vector<int64_t>{2, 0, 3, 1, 4});
    CHECK(first_tokens == 5);  // each request's first token, and only that one, carries its queue time
    CHECK(sched.idle());
}

TEST_CASE("step cost: a + b * tokens fitted to measured steps; tokens_within inverts it") {
    StepCost c;
    CHECK(!c.ready());
    c.observe(10, 0.1);  // one token count only: b is the mean seconds per token, a is 0
    CHECK(c.ready());
    CHECK(c.b() == doctest::Approx(0.01));
    CHECK(c.a() == doctest::Approx(0.0));
    for (int64_t t : {1, 40, 7, 200, 64, 3, 128})  // 20 ms fixed + 1 ms per token
        for (int rep = 0; rep < 3; ++rep) c.observe(t, 0.02 + 0.001 * double(t));
    CHECK(c.b() == doctest::Approx(0.001).epsilon(0.02));
    CHECK(c.a() == doctest::Approx(0.02).epsilon(0.05));
    CHECK(c.tokens_within(0.1) == doctest::Approx(80).epsilon(0.05));
    CHECK(c.tokens_within(0.015) == 0);  // below the fixed part: nothing fits
    // The model follows a change (recent steps weigh most): the machine gets 3x slower.
    for (int i = 0; i < 200; ++i) c.observe(1 + 17 * (i % 12), 3 * (0.02 + 0.001 * double(1 + 17 * (i % 12))));
    CHECK(c.b() == doctest::Approx(0.003).epsilon(0.05));
    c.observe(0, 1.0);   // ignored: no tokens
    c.observe(5, -1.0);  // ignored: negative
    CHECK(c.b() == doctest::Approx(0.003).epsilon(0.05));
}

// A step's time in this test: 10 ms + 2 ms per token. With 8 sequences decoding and a long prompt
// waiting, a 61 ms target leaves floor((61 - 10) / 2) - 8 = 17 prompt tokens per step; no target: 200.
TEST_CASE("scheduler: a latency target bounds the prompt chunk of a step with decodes, never below min_chunk") {
    auto run = [](double max_itl_s, int64_t min_chunk) {
        BlockPool pool(256, 8, false);
        SchedulerOptions o;
        o.step_tokens = 200;
        o.step_capacity = 200 + 9;
        o.max_seqs = 9;
        o.max_seq = 512;
        o.vocab = 100;
        o.max_itl_s = max_itl_s;
        o.min_chunk = min_chunk;
        Scheduler sched(o, pool);
        for (int i = 0; i < 8; ++i) {
            EngineRequest r;
            r.prompt = {1, 2};
            r.max_new_tokens = 60;
            r.ignore_eos = true;
            sched.add(r);
        }
        std::vector<int64_t> chunks;  // prompt tokens of the long prompt per step, once the 8 decode
        bool long_added = false;
        for (int64_t step = 1; step <= 200 && !sched.idle(); ++step) {
            const StepPlan p = sched.next(step);
            int64_t sampled = 0, decodes = 0, long_tokens = 0;
            for (const PlanSeq& s : p.seqs) {
                sampled += s.sample;
                decodes += s.id < 8 && s.start >= 2;
                if (s.id == 8) long_tokens += s.count;
            }
            if (long_tokens > 0 && decodes == 8) chunks.push_back(long_tokens);
            sched.observe_step(int64_t(p.tokens.size()), 0.010 + 0.002 * double(p.tokens.size()));
            sched.complete(p, std::vector<SampledToken>(size_t(sampled), SampledToken{7, -1.0f}));
            sched.take_finished();
            if (step == 3 && !long_added) {  // the 8 decode by now: a 400-token prompt arrives
                EngineRequest r;
                r.prompt.assign(400, 5);
                r.max_new_tokens = 1;
                sched.add(r);
                long_added = true;
            }
        }
        CHECK(sched.idle());
        CHECK(pool.num_free() == 256);
        return chunks;
    };
    const std::vector<int64_t> none = run(0, 16);
    REQUIRE(!none.empty());
    CHECK(none.front() == 200);  // no target: the whole budget
    const std::vector<int64_t> tight = run(0.061, 16);
    REQUIRE(tight.size() > 2);
    for (size_t i = 0; i + 1 < tight.size(); ++i) CHECK(tight[i] == 17);  // the last chunk: what was left
    CHECK(tight.back() <= 17);
    const std::vector<int64_t> below = run(0.020, 16);  // below what the decodes alone cost
    REQUIRE(below.size() > 2);
    for (size_t i = 0; i + 1 < below.size(); ++i) CHECK(below[i] == 16);  // min_chunk: the prompt still progresses
}

// The engine's pipelined loop (engine.cpp: step()): up to `stages` plans in flight, the oldest
// completed before the next is issued. 16 prompts of 64 tokens, 32 prompt tokens per step: each
// prompt spans two steps, so its first token is sampled in steps of one parity only (the shape of
// 512-token prompts in 256-token steps that left every other step of a tp 4 x pp 2 run decodes only).
TEST_CASE("scheduler: with a pipeline every step in flight takes a prompt chunk and an even share of the decodes") {
    BlockPool pool(512, 8, false);
    SchedulerOptions o;
    o.step_tokens = 32;
    o.step_capacity = 32 + 8;
    o.max_seqs = 16;
    o.max_seq = 256;
    o.vocab = 100;
    o.micro_batches = 2;
    Scheduler sched(o, pool);
    const int64_t prompt = 64, n = 16;
    for (int i = 0; i < n; ++i) {
        EngineRequest r;
        r.prompt.assign(size_t(prompt), 3);
        r.max_new_tokens = 24;
        r.ignore_eos = true;
        sched.add(r);
    }
    std::deque<StepPlan> inflight;
    std::vector<int64_t> decodes;                                     // per step, in issue order
    int64_t prompt_left = n * prompt, number = 0, without_chunk = 0;  // (number: the plans' numbers)
    for (int guard = 0; guard < 1000 && !sched.idle(); ++guard) {
        while (inflight.size() < 2) {
            StepPlan p = sched.next(++number);
            if (p.empty()) break;
            int64_t d = 0, pt = 0;
            for (const PlanSeq& s : p.seqs) {
                const bool decode = s.start >= prompt;
                d += decode;
                pt += decode ? 0 : s.count;
            }
            without_chunk += prompt_left > 0 && pt == 0;
            decodes.push_back(d);
            prompt_left -= pt;
            inflight.push_back(std::move(p));
        }
        REQUIRE(!inflight.empty());
        const StepPlan p = std::move(inflight.front());
        inflight.pop_front();
        sched.complete(p, std::vector<SampledToken>(size_t(p.sampled()), SampledToken{7, -1.0f}));
        sched.take_finished();
    }
    CHECK(sched.idle());
    CHECK(pool.num_free() == 512);
    CHECK(prompt_left == 0);
    // While prompt tokens are left, no step is decodes only (before: every other one, once the decodes
    // of one parity filled its cap of 8 sequences) ...
    CHECK(without_chunk == 0);
    // ... and the two steps in flight hold decode counts at most one apart (before: 0 and 7).
    int64_t most_apart = 0;
    for (size_t i = 1; i < decodes.size(); ++i)
        most_apart = std::max(most_apart, std::abs(decodes[i] - decodes[i - 1]));
    CHECK(most_apart <= 1);
    // So the run takes fewer steps: 78 (32 with prompt chunks), 93 before.
    CHECK(decodes.size() <= 80);
}
