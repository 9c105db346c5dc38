// WorldConfig and stage_layer_ranges, exhaustively and without MPI: every world size 1..64 with
// every tp, pp in 1..64 (valid factorizations and not), rank mapping bijective, TP groups on
// consecutive ranks, layer split balanced / overridden / rejected; the named limits, the one check of
// tp and pp, the max_seq default, device per local rank and ranks per node.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "parallel/world_config.h"
#include "base/error.h"

using namespace lattice;

namespace {

// Error text without the "[host rX/Y file:line] " prefix, i.e. what every rank prints alike.
std::string body(const Error& e) {
    std::string s = e.what();
    size_t p = s.find("] ");
    return p == std::string::npos ? s : s.substr(p + 2);
}

}  // namespace

TEST_CASE("WorldConfig: every world 1..64 and every tp x pp, valid or rejected with one message") {
    // Plain counters inside the loops (doctest assertions per element would take minutes).
    int64_t valid_layouts = 0, rejected = 0, bad = 0;
    for (int world = 1; world <= 64; ++world) {
        for (int tp = 1; tp <= 64; ++tp) {
            for (int pp = 1; pp <= 64; ++pp) {
                if (tp * pp != world) {
                    // Every rank of a bad layout fails with the same text (no rank proceeds). All
                    // ranks for small worlds, first / middle / last for the rest.
                    const std::string want = fmt::format("world size {} != tp {} x pp {}", world, tp, pp);
                    std::string first;
                    for (int rank = 0; rank < world; ++rank) {
                        if (world > 8 && rank != 0 && rank != world / 2 && rank != world - 1) continue;
                        try {
                            (void)WorldConfig::make(world, tp, pp, rank);
                            ++bad;
                        } catch (const Error& e) {
                            if (rank == 0) first = body(e);
                            bad += first.find(want) == std::string::npos || body(e) != first;
                        }
                    }
                    ++rejected;
                    continue;
                }
                ++valid_layouts;
                std::set<std::pair<int, int>> coords;
                for (int rank = 0; rank < world; ++rank) {
                    WorldConfig w = WorldConfig::make(world, tp, pp, rank);
                    bad += w.tp_rank() < 0 || w.tp_rank() >= tp || w.pp_rank() < 0 || w.pp_rank() >= pp;
                    bad += w.rank_of(w.tp_rank(), w.pp_rank()) != rank;
                    coords.insert({w.tp_rank(), w.pp_rank()});
                    // TP group = consecutive ranks [pp_rank*tp, pp_rank*tp + tp).
                    bad += rank / tp != w.pp_rank();
                    bad += w.rank_of(0, w.pp_rank()) != w.pp_rank() * tp;
                    bad += w.rank_of(tp - 1, w.pp_rank()) != w.pp_rank() * tp + tp - 1;
                    // Pipeline neighbour with the same tp_rank is world rank + tp.
                    if (!w.is_last_stage()) bad += w.rank_of(w.tp_rank(), w.pp_rank() + 1) != rank + tp;
                    bad += w.is_first_stage() != (rank < tp);
                    bad += w.is_last_stage() != (rank >= world - tp);
                    bad += w.sampler_rank() != (pp - 1) * tp;
                }
                bad += int(coords.size()) != world;  // bijective onto the tp x pp grid
            }
        }
    }
    CHECK(bad == 0);
    // Number of ordered factor pairs summed over 1..64 (sum of divisor counts) = 280.
    CHECK(valid_layouts == 280);
    CHECK(rejected == 64 * 64 * 64 - 280);
}

TEST_CASE("WorldConfig: out-of-range values are rejected") {
    CHECK_THROWS_AS(WorldConfig::make(1, 0, 1, 0), Error);
    CHECK_THROWS_AS(WorldConfig::make(1, 1, 0, 0), Error);
    CHECK_THROWS_AS(WorldConfig::make(4, -2, -2, 0), Error);
    CHECK_THROWS_AS(WorldConfig::make(0, 1, 1, 0), Error);
    CHECK_THROWS_AS(WorldConfig::make(4, 2, 2, 4), Error);
    CHECK_THROWS_AS(WorldConfig::make(4, 2, 2, -1), Error);
    CHECK_THROWS_AS(WorldConfig::make(4, 2, 2, 1, 2, 2), Error);  // local rank >= local size
    CHECK_THROWS_AS(WorldConfig::make(4, 2, 2, 1, 0, 0), Error);
    CHECK_NOTHROW(WorldConfig::make(4, 2, 2, 3, 1, 2));
}

TEST_CASE("WorldConfig: device mapping and describe") {
    WorldConfig w = WorldConfig::make(8, 2, 4, 5, 1, 4);
    CHECK(w.device() == 1);
    CHECK(w.device({3, 2, 1, 0}) == 2);
    CHECK_THROWS_AS(w.device({7}), Error);  // list shorter than the ranks on this node
    CHECK(w.describe() == "rank 5/8 (tp 1/2, pp 2/4)");
}

TEST_CASE("stage_layer_ranges: balanced split for every n_layers 1..100 and pp 1..n") {
    int64_t bad = 0;
    for (int64_t n = 1; n <= 100; ++n) {
        for (int pp = 1; pp <= n; ++pp) {
            auto r = stage_layer_ranges(n, pp);
            REQUIRE(int(r.size()) == pp);
            bad += r.front().first != 0 || r.back().second != n;
            int64_t lo = n, hi = 0;
            for (int s = 0; s < pp; ++s) {
                int64_t c = r[size_t(s)].second - r[size_t(s)].first;
                bad += c < 1;
                if (s > 0) {
                    bad += r[size_t(s)].first != r[size_t(s - 1)].second;         // contiguous, no gap or overlap
                    bad += c > r[size_t(s - 1)].second - r[size_t(s - 1)].first;  // earlier stages get extras
                }
                lo = std::min(lo, c);
                hi = std::max(hi, c);
            }
            bad += hi - lo > 1;
        }
        CHECK_THROWS_AS(stage_layer_ranges(n, int(n) + 1), Error);  // more stages than layers
    }
    CHECK(bad == 0);
    CHECK_THROWS_AS(stage_layer_ranges(10, 0), Error);
    auto r = stage_layer_ranges(80, 3);
    CHECK(r[0] == std::make_pair<int64_t, int64_t>(0, 27));
    CHECK(r[1] == std::make_pair<int64_t, int64_t>(27, 54));
    CHECK(r[2] == std::make_pair<int64_t, int64_t>(54, 80));
}

TEST_CASE("stage_layer_ranges: --pp-layers override and its errors") {
    auto r = stage_layer_ranges(80, 4, {20, 20, 21, 19});
    REQUIRE(r.size() == 4);
    CHECK(r[0] == std::make_pair<int64_t, int64_t>(0, 20));
    CHECK(r[1] == std::make_pair<int64_t, int64_t>(20, 40));
    CHECK(r[2] == std::make_pair<int64_t, int64_t>(40, 61));
    CHECK(r[3] == std::make_pair<int64_t, int64_t>(61, 80));
    auto one = stage_layer_ranges(5, 1, {5});
    CHECK(one[0] == std::make_pair<int64_t, int64_t>(0, 5));

    auto msg = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return body(e);
        }
        return std::string("no error");
    };
    CHECK(msg([] {
              stage_layer_ranges(80, 4, {20, 20, 40});
          }).find("3 entries for 4 pipeline stages") != std::string::npos);
    CHECK(msg([] {
              stage_layer_ranges(80, 4, {20, 20, 20, 19});
          }).find("sums to 79 but the model has 80") != std::string::npos);
    CHECK(msg([] { stage_layer_ranges(80, 4, {40, 40, 0, 0}); }).find("at least one layer") != std::string::npos);
    CHECK(msg([] { stage_layer_ranges(80, 2, {90, -10}); }).find("at least one layer") != std::string::npos);
}

TEST_CASE("shard_shape: heads, kv heads (split or replicated), FFN and padded vocab per TP rank") {
    const ModelDims llama70{80, 64, 8, 28672, 32000, "llama-2-70b"};
    for (int tp : {1, 2, 4, 8}) {
        int64_t heads = 0, ffn = 0, vocab = 0;
        for (int r = 0; r < tp; ++r) {
            const ShardShape s = shard_shape(llama70, tp, r);
            CHECK(s.head0 == heads);
            CHECK(s.ffn0 == ffn);
            CHECK(s.vocab0 == r * s.vocab_per_rank);
            CHECK(s.n_kv == 8 / tp);
            CHECK(s.kv_head0 == r * (8 / tp));
            heads += s.n_heads;
            ffn += s.ffn;
            vocab += s.vocab_rows;
        }
        CHECK(heads == 64);
        CHECK(ffn == 28672);
        CHECK(vocab == 32000);
    }
    // tp > kv heads: one kv head per rank, the one its query heads use.
    const ModelDims gqa{4, 8, 2, 64, 301, "gqa"};
    for (int r = 0; r < 4; ++r) {
        const ShardShape s = shard_shape(gqa, 4, r);
        CHECK(s.n_kv == 1);
        CHECK(s.kv_head0 == r / 2);
    }
    // Vocab padding: 301 over 4 ranks is 76 + 76 + 76 + 73.
    CHECK(shard_shape(gqa, 4, 3).vocab_rows == 73);
    CHECK(shard_shape(gqa, 4, 3).vocab_per_rank == 76);
    auto msg = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return body(e);
        }
        return std::string("no error");
    };
    const ModelDims smol{30, 9, 3, 1536, 49152, "smollm2"};
    CHECK(msg([&] { shard_shape(smol, 2, 0); }).find("tp 2 does not divide num_attention_heads 9") != std::string::npos);
    CHECK(msg([&] { check_model_layout(smol, 3, 31); }).find("pp 31 exceeds the model's 30 layers") != std::string::npos);
    CHECK_NOTHROW(check_model_layout(smol, 3, 30));
    CHECK(msg([&] { check_model_layout(gqa, 6, 1); }).find("does not divide") != std::string::npos);
}

namespace {
Placement gpu_nodes(int nodes, int gpus) {
    Placement p;
    p.nodes = nodes;
    p.gpus_per_node = gpus;
    return p;
}
}  // namespace

TEST_CASE("check_placement: ranks per node, whole TP groups per node, GPUs and cores") {
    auto msg = [](int tp, int pp, Placement p) {
        try {
            return "ok " + std::to_string(check_placement(tp, pp, p));
        } catch (const Error& e) {
            return body(e);
        }
    };
    Placement gpu8;
    gpu8.gpus_per_node = 8;
    CHECK(msg(8, 1, gpu8) == "ok 8");
    CHECK(msg(4, 2, gpu8) == "ok 8");
    CHECK(msg(4, 4, gpu8).find("need 16 GPUs per node but there are 8") != std::string::npos);
    Placement two_nodes = gpu8;
    two_nodes.nodes = 2;
    CHECK(msg(8, 2, two_nodes) == "ok 8");
    CHECK(msg(3, 2, two_nodes).find("power of two") != std::string::npos);
    CHECK(msg(4, 1, gpu_nodes(3, 8)).find("cannot be spread evenly over 3 nodes") != std::string::npos);
    CHECK(msg(2, 1, gpu_nodes(3, 8)).find("3 nodes but only tp*pp = 2 ranks") != std::string::npos);
    Placement odd = gpu8;
    odd.gpus_per_node = 6;
    CHECK(msg(4, 1, odd).find("tp 4 does not divide the 6 GPUs per node") != std::string::npos);
    CHECK(msg(2, 1, gpu_nodes(1, 0)).find("no GPUs found") != std::string::npos);
    // A TP group may not span nodes: 4 nodes x 2 ranks with tp 4.
    Placement four = gpu_nodes(4, 8);
    CHECK(msg(4, 2, four).find("do not hold whole TP groups of 4") != std::string::npos);
    // CPU ranks: cores bound the ranks per node unless oversubscribed; GPUs cannot be oversubscribed.
    Placement cpu;
    cpu.cpu = true;
    cpu.cores_per_node = 2;
    CHECK(msg(2, 1, cpu) == "ok 2");
    CHECK(msg(2, 2, cpu).find("4 CPU ranks per node but only 2 cores") != std::string::npos);
    cpu.oversubscribe = true;
    CHECK(msg(2, 2, cpu) == "ok 4");
    Placement over = gpu8;
    over.oversubscribe = true;
    CHECK(msg(2, 1, over).find("never share a GPU") != std::string::npos);
    Placement slots = gpu8;
    slots.nodes = 2;
    slots.slots_per_node = 2;
    slots.slots_host = "n2";
    CHECK(msg(4, 2, slots).find("host 'n2' has 2 slots but the layout needs 4") != std::string::npos);
}

TEST_CASE("check_layout_sizes: the one check of tp and pp, with one message") {
    auto msg = [](int tp, int pp) {
        try {
            check_layout_sizes(tp, pp);
            return std::string("ok");
        } catch (const Error& e) {
            return body(e);
        }
    };
    int64_t bad = 0;
    for (int tp : {-1, 0, 1, 2, kMaxTp - 1, kMaxTp, kMaxTp + 1, INT32_MAX})
        for (int pp : {-1, 0, 1, 3, kMaxPp, kMaxPp + 1}) {
            const bool valid = tp >= 1 && tp <= kMaxTp && pp >= 1 && pp <= kMaxPp;
            const std::string want = valid ? "ok" : fmt::format("tp {} x pp {}: each must be in [1, 4096]", tp, pp);
            bad += msg(tp, pp) != want;
            // Every entry point that takes a layout gives the same message.
            if (!valid) {
                try {
                    (void)WorldConfig::make(1, tp, pp, 0);
                    ++bad;
                } catch (const Error& e) {
                    bad += body(e) != want;
                }
                try {
                    check_placement(tp, pp, Placement{});
                    ++bad;
                } catch (const Error& e) {
                    bad += body(e) != want;
                }
            }
        }
    CHECK(bad == 0);
    CHECK(kMaxTp == 4096);
    CHECK(kMaxPp == 4096);
    const ModelDims tiny{4, 4, 4, 16, 32, "tiny"};
    CHECK(msg(0, 1) == "tp 0 x pp 1: each must be in [1, 4096]");
    CHECK_THROWS_WITH_AS(check_model_layout(tiny, 0, 1), doctest::Contains("tp 0 x pp 1: each must be in"), Error);
    CHECK_THROWS_WITH_AS(stage_layer_ranges(10, 0), doctest::Contains("tp 1 x pp 0: each must be in"), Error);
}

TEST_CASE("resolve_max_seq: asked for, else the model's positions capped at kDefaultMaxSeq") {
    CHECK(kDefaultMaxSeq == 4096);
    CHECK(resolve_max_seq(0, 2048) == 2048);
    CHECK(resolve_max_seq(0, 4096) == 4096);
    CHECK(resolve_max_seq(0, 131072) == kDefaultMaxSeq);
    CHECK(resolve_max_seq(-5, 100) == 100);
    CHECK(resolve_max_seq(1, 131072) == 1);
    CHECK(resolve_max_seq(8192, 131072) == 8192);
    CHECK(resolve_max_seq(8192, 100) == 8192);  // the model checks it against its positions, with its name
}

TEST_CASE("device_of_local_rank: local rank i uses device i, or the i-th listed") {
    for (int local_size = 1; local_size <= 16; ++local_size)
        for (int local = 0; local < local_size; ++local) {
            CHECK(device_of_local_rank(local, local_size) == local);
            std::vector<int> reversed;
            for (int d = local_size - 1; d >= 0; --d) reversed.push_back(d);
            CHECK(device_of_local_rank(local, local_size, reversed) == local_size - 1 - local);
            // WorldConfig::device asks the same rule.
            const WorldConfig w = WorldConfig::make(local_size, 1, local_size, local, local, local_size);
            CHECK(w.device() == local);
            CHECK(w.device(reversed) == local_size - 1 - local);
        }
    CHECK_THROWS_WITH_AS(device_of_local_rank(2, 4, {5, 6}), doctest::Contains("--devices lists 2 devices"), Error);
}

TEST_CASE("ranks_per_node and node_holds_whole_tp_groups: every world 1..64 over 1..64 nodes") {
    int64_t bad = 0, fits = 0;
    for (int world = 1; world <= 64; ++world)
        for (int nodes = 1; nodes <= 64; ++nodes) {
            const bool even = nodes <= world && world % nodes == 0;
            try {
                const int k = ranks_per_node(world, nodes);
                bad += !even || k * nodes != world;
                ++fits;
            } catch (const Error& e) {
                bad += even;
                const std::string why = body(e);
                bad += nodes > world ? why.find("every node needs at least one rank") == std::string::npos
                                     : why.find("cannot be spread evenly") == std::string::npos;
            }
            for (int tp = 1; tp <= 64; ++tp) bad += node_holds_whole_tp_groups(world, tp) != (world % tp == 0);
        }
    CHECK(bad == 0);
    CHECK(fits == 280);  // ordered factor pairs again: one per divisor
    CHECK_THROWS_WITH_AS(ranks_per_node(4, 0), doctest::Contains("invalid node count 0"), Error);
    CHECK_FALSE(node_holds_whole_tp_groups(4, 0));
}

TEST_CASE("stage_layer_range: the stage's own range, balanced or overridden") {
    int64_t bad = 0;
    for (int64_t n = 1; n <= 40; ++n)
        for (int pp = 1; pp <= n; ++pp) {
            const auto all = stage_layer_ranges(n, pp);
            for (int s = 0; s < pp; ++s) bad += stage_layer_range(n, pp, s) != all[size_t(s)];
        }
    CHECK(bad == 0);
    CHECK(stage_layer_range(80, 4, 2, {20, 20, 21, 19}) == LayerRange(40, 61));
    CHECK_THROWS_WITH_AS(stage_layer_range(80, 4, 4), doctest::Contains("invalid pipeline stage 4 of 4"), Error);
    CHECK_THROWS_WITH_AS(stage_layer_range(80, 4, -1), doctest::Contains("invalid pipeline stage -1 of 4"), Error);
    CHECK_THROWS_WITH_AS(stage_layer_range(80, 2, 0, {40, 39}), doctest::Contains("sums to 79"), Error);
}
