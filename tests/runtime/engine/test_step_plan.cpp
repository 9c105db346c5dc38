// The step plan's block tables as changes (step_plan.h): over 1000 random steps (joins, appended
// blocks, preemptions that re-admit a sequence with other blocks, finishes, heartbeats) the
// follower's decoded tables equal the leader's every step and both sides' PlanTables stay equal;
// a decode step's plan has the same size at 4k and 32k context; a change against a table the
// follower does not know, or a cut message, is refused naming the field and leaves its tables as
// they were. Grammar masks (structured output) travel with their sequences; counts that disagree
// are refused.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/engine/step_plan.h"

using namespace lattice;

namespace {

// A step plan of `tables` (id -> blocks), one fed token per sequence, tables padded to `width`.
StepPlan plan_of(const std::map<int64_t, std::vector<int32_t>>& tables, int32_t width, int64_t number) {
    StepPlan p;
    p.number = number;
    p.width = width;
    for (const auto& [id, row] : tables) {
        PlanSeq s;
        s.id = id;
        s.start = int32_t(row.size());
        s.count = 1;
        s.sample = true;
        p.seqs.push_back(s);
        p.tokens.push_back(int32_t(id % 1000));
        std::vector<int32_t> padded = row;
        padded.resize(size_t(width), -1);
        p.tables.insert(p.tables.end(), padded.begin(), padded.end());
    }
    return p;
}

}  // namespace

TEST_CASE("plan deltas: 1000 random steps, the follower rebuilds the leader's block tables every step") {
    constexpr int32_t W = 12;
    std::mt19937_64 rng(1234);
    auto pick = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };
    auto random_row = [&](int64_t n) {
        std::vector<int32_t> r;
        for (int64_t i = 0; i < n; ++i) r.push_back(int32_t(pick(5000)));
        return r;
    };
    std::map<int64_t, std::vector<int32_t>> live;  // the scheduler's sequences and their blocks
    std::vector<int64_t> released;
    int64_t next_id = 1;
    PlanTables leader, follower;
    int64_t delta_bytes = 0, full_bytes = 0, joins = 0, appends = 0, preempts = 0, finishes = 0;
    for (int64_t step = 1; step <= 1000; ++step) {
        for (int64_t j = pick(3); j > 0 && live.size() < 20; --j, ++joins) live[next_id++] = random_row(1 + pick(W / 2));
        for (auto& [id, row] : live) {
            const int64_t r = pick(10);
            if (r < 3 && int64_t(row.size()) < W) {
                row.push_back(int32_t(pick(5000)));
                ++appends;
            } else if (r == 3) {
                row = random_row(1 + pick(W));  // preempted and re-admitted: other blocks, maybe fewer
                ++preempts;
            }
        }
        for (int64_t f = pick(3); f > 0 && !live.empty(); --f, ++finishes) {
            auto it = std::next(live.begin(), std::ptrdiff_t(pick(int64_t(live.size()))));
            released.push_back(it->first);
            live.erase(it);
        }
        // A random subset of the running sequences is in this step (the rest wait: micro-batches).
        std::map<int64_t, std::vector<int32_t>> in_step;
        for (const auto& [id, row] : live)
            if (pick(4) != 0) in_step[id] = row;
        StepPlan p = plan_of(in_step, W, step);
        if (in_step.empty() || pick(10) == 0) {  // a heartbeat: releases only
            p = StepPlan{};
            p.kind = StepPlan::Kind::kHeartbeat;
            p.number = step;
        }
        p.released = std::exchange(released, {});
        const std::vector<uint8_t> bytes = encode_plan(p, leader);
        const StepPlan q = decode_plan(bytes.data(), int64_t(bytes.size()), follower);
        REQUIRE(q.tables == p.tables);
        REQUIRE(q.width == p.width);
        REQUIRE(q.released == p.released);
        REQUIRE(q.seqs.size() == p.seqs.size());
        REQUIRE(follower == leader);
        delta_bytes += int64_t(bytes.size());
        full_bytes += int64_t(encode_plan(p).size());
    }
    CHECK(joins > 100);
    CHECK(appends > 100);
    CHECK(preempts > 100);
    CHECK(finishes > 100);
    CHECK(delta_bytes < full_bytes);  // most steps keep or append
    // Finished sequences leave both sides (the follower's state does not grow without bound).
    for (const auto& [id, row] : follower.rows) CHECK(live.count(id) == 1);
}

TEST_CASE("plan deltas: a decode step's plan has the same size at 4k and 32k context") {
    auto sizes = [](int32_t ctx) {
        const int32_t block = 16, W = ctx / block;
        std::map<int64_t, std::vector<int32_t>> tables;
        for (int64_t id = 0; id < 64; ++id) {
            std::vector<int32_t> row;
            for (int32_t b = 0; b < W - 1; ++b) row.push_back(int32_t(id * W + b));  // nearly full context
            tables[id] = row;
        }
        PlanTables leader, follower;
        const StepPlan join = plan_of(tables, W, 1);
        const std::vector<uint8_t> first = encode_plan(join, leader);
        decode_plan(first.data(), int64_t(first.size()), follower);
        tables[5].push_back(99999);  // one sequence crosses into a new block this step
        const StepPlan decode = plan_of(tables, W, 2);
        const std::vector<uint8_t> bytes = encode_plan(decode, leader);
        const StepPlan q = decode_plan(bytes.data(), int64_t(bytes.size()), follower);
        CHECK(q.tables == decode.tables);
        return std::pair<int64_t, int64_t>(int64_t(bytes.size()), int64_t(encode_plan(decode).size()));
    };
    const auto [d4, full4] = sizes(4096);
    const auto [d32, full32] = sizes(32768);
    CHECK(d4 == d32);
    CHECK(d4 < 64 * 96);          // per sequence its fields, not its table
    CHECK(full32 > 7 * full4);    // (whole tables would grow with the context)
}

TEST_CASE("plan deltas: an unknown table or a cut message is refused naming the field; nothing changes") {
    std::map<int64_t, std::vector<int32_t>> tables = {{7, {1, 2}}, {8, {3}}};
    PlanTables leader, follower;
    const std::vector<uint8_t> join = encode_plan(plan_of(tables, 4, 1), leader);
    decode_plan(join.data(), int64_t(join.size()), follower);
    tables[7].push_back(4);
    const std::vector<uint8_t> next = encode_plan(plan_of(tables, 4, 2), leader);
    PlanTables stranger;  // a rank that missed the join
    CHECK_THROWS_WITH_AS(decode_plan(next.data(), int64_t(next.size()), stranger),
                         doctest::Contains("does not know"), Error);
    CHECK(stranger.rows.empty());
    const PlanTables before = follower;
    CHECK_THROWS_WITH_AS(decode_plan(next.data(), int64_t(next.size()) - 3, follower),
                         doctest::Contains("adapter loads"), Error);
    CHECK(follower == before);
    std::vector<uint8_t> old = next;
    old[0] = 0x32;  // version 2 (the magic is little-endian: its low byte is the version)
    CHECK_THROWS_WITH_AS(decode_plan(old.data(), int64_t(old.size()), follower), doctest::Contains("version 2"), Error);
    const StepPlan q = decode_plan(next.data(), int64_t(next.size()), follower);
    CHECK(q.tables == std::vector<int32_t>{1, 2, 4, -1, 3, -1, -1, -1});
    CHECK(follower == leader);
}

TEST_CASE("plan masks: each masked sequence's words arrive with it; a count that disagrees is refused") {
    std::map<int64_t, std::vector<int32_t>> tables = {{3, {1}}, {4, {2}}, {5, {6}}};
    StepPlan p = plan_of(tables, 2, 1);
    p.seqs[0].masked = true;
    p.seqs[2].masked = true;
    p.mask_width = 3;  // a vocab of 65..96
    p.masks = {0x1u, 0x0u, 0x80000000u, 0xffffffffu, 0x12345678u, 0x0u};
    const std::vector<uint8_t> msg = encode_plan(p);
    const StepPlan q = decode_plan(msg.data(), int64_t(msg.size()));
    CHECK(q.seqs[0].masked);
    CHECK_FALSE(q.seqs[1].masked);
    CHECK(q.seqs[2].masked);
    CHECK(q.mask_width == 3);
    CHECK(q.masks == p.masks);
    StepPlan bad = p;
    bad.masks.pop_back();  // 5 words for 2 masks of 3
    const std::vector<uint8_t> m2 = encode_plan(bad);
    CHECK_THROWS_WITH_AS(decode_plan(m2.data(), int64_t(m2.size())), doctest::Contains("mask words"), Error);
    bad = p;
    bad.seqs[0].sample = false;  // a mask on a sequence that is not sampled
    const std::vector<uint8_t> m3 = encode_plan(bad);
    CHECK_THROWS_WITH_AS(decode_plan(m3.data(), int64_t(m3.size())), doctest::Contains("masked but not sampled"),
                         Error);
}

TEST_CASE("plan LoRA: each sequence's adapter slot and the plan's adapter loads arrive; a bad slot is refused") {
    StepPlan p = plan_of({{7, {1, 2}}, {8, {3}}}, 4, 1);
    p.seqs[0].lora = 3;
    p.loras = {LoraLoad{3, "sql", "/adapters/sql"}, LoraLoad{2, "old", ""}};
    PlanTables leader, follower;
    std::vector<uint8_t> m = encode_plan(p, leader);
    CHECK(p.loras.size() == 2);
    const StepPlan q = decode_plan(m.data(), int64_t(m.size()), follower);
    CHECK(q.seqs[0].lora == 3);
    CHECK(q.seqs[1].lora == 0);
    REQUIRE(q.loras.size() == 2);
    CHECK(q.loras[0].slot == 3);
    CHECK(q.loras[0].name == "sql");
    CHECK(q.loras[0].path == "/adapters/sql");
    CHECK(q.loras[1].path.empty());
    p.loras[0].slot = kMaxLoraSlots;
    PlanTables l2, f2;
    m = encode_plan(p, l2);
    CHECK_THROWS_WITH_AS(decode_plan(m.data(), int64_t(m.size()), f2), doctest::Contains("into slot 4096"), Error);
}
