// KvCacheManager (runtime/engine/kv_cache_manager.h) alone, over a BlockPool, no scheduler and no MPI:
// tables grow as positions are reached and all or nothing; free() returns every block; an admitted
// prompt takes the registered full blocks of an identical prefix but never its last token; blocks
// register only once full and only in a sequence's own token order; the victim of a preemption is
// the highest priority value, the youngest among equals.
#include <doctest/doctest.h>

#include <numeric>
#include <span>
#include <vector>

#include "runtime/engine/kv_cache_manager.h"

using namespace lattice;

namespace {
std::vector<int32_t> iota_tokens(int n, int first = 10) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    std::iota(t.begin(), t.end(), first);
    return t;
}
}  // namespace

TEST_CASE("kv cache manager: tables grow with positions, all or nothing, and free returns every block") {
    BlockPool pool(6, 4, false);
    KvCacheManager kv(pool);
    CHECK(kv.blocks_for(0) == 0);
    CHECK(kv.blocks_for(4) == 1);
    CHECK(kv.blocks_for(5) == 2);
    REQUIRE(kv.allocate(1, 5));  // 2 blocks
    CHECK(kv.blocks(1).size() == 2);
    REQUIRE(kv.allocate(1, 8));  // still 2: no new block for positions the table already holds
    CHECK(kv.blocks(1).size() == 2);
    REQUIRE(kv.allocate(2, 9));  // 3 blocks
    CHECK(pool.num_free() == 1);
    CHECK_FALSE(kv.allocate(1, 16));  // needs 2 more, 1 free: nothing taken
    CHECK(kv.blocks(1).size() == 2);
    CHECK(pool.num_free() == 1);
    kv.free(2);
    CHECK(kv.blocks(2).empty());
    REQUIRE(kv.allocate(1, 16));
    CHECK(kv.blocks(1).size() == 4);
    kv.free(1);
    kv.free(1);  // unknown now: nothing happens
    CHECK(pool.num_free() == pool.num_blocks());
}

TEST_CASE("kv cache manager: a prompt takes the registered full blocks of its prefix, never its last token") {
    BlockPool pool(16, 4, true);
    KvCacheManager kv(pool);
    const std::vector<int32_t> a = iota_tokens(10);  // 2 full blocks and 2 tokens
    CHECK(kv.admit_prefix(0, a) == 0);  // nothing cached yet
    REQUIRE(kv.allocate(0, 10));
    kv.register_full_blocks(0, a, 7);  // one block's K/V complete: only it registers
    std::vector<int32_t> b = a;
    b[5] = 99;  // differs in the second block
    CHECK(kv.admit_prefix(1, b) == 4);
    CHECK(kv.blocks(1).size() == 1);
    CHECK(kv.blocks(1)[0] == kv.blocks(0)[0]);  // shared, not copied
    kv.register_full_blocks(0, a, 10);         // now both full blocks of a
    CHECK(kv.admit_prefix(2, a) == 8);
    CHECK(kv.blocks(2).size() == 2);
    // A prompt of exactly two blocks leaves its last token to compute: one block only.
    const std::vector<int32_t> two(a.begin(), a.begin() + 8);
    CHECK(kv.admit_prefix(3, two) == 4);
    kv.free(0);
    kv.free(1);
    kv.free(2);
    kv.free(3);
    CHECK(pool.num_free() == pool.num_blocks());
    CHECK(pool.cache_hits() == 4);  // 1 (b) + 2 (a) + 1 (two)
}

TEST_CASE("kv cache manager: a prefix cached under one root (LoRA adapter) is not found under another") {
    BlockPool pool(16, 4, true);
    KvCacheManager kv(pool);
    const std::vector<int32_t> a = iota_tokens(10);
    CHECK(kv.admit_prefix(0, a, 7) == 0);
    REQUIRE(kv.allocate(0, 10));
    kv.register_full_blocks(0, a, 10);
    CHECK(kv.admit_prefix(1, a) == 0);     // the base model: nothing
    CHECK(kv.admit_prefix(2, a, 8) == 0);  // another adapter: nothing
    CHECK(kv.admit_prefix(3, a, 7) == 8);  // the same adapter: both blocks
    CHECK(kv.blocks(3)[0] == kv.blocks(0)[0]);
    for (int64_t s = 0; s < 4; ++s) kv.free(s);
    CHECK(pool.num_free() == pool.num_blocks());
}

TEST_CASE("kv cache manager: without prefix caching nothing is found or registered") {
    BlockPool pool(8, 2, false);
    KvCacheManager kv(pool);
    const std::vector<int32_t> a = iota_tokens(6);
    REQUIRE(kv.allocate(0, 6));
    kv.register_full_blocks(0, a, 6);
    CHECK(kv.admit_prefix(1, a) == 0);
    CHECK(kv.blocks(1).empty());
    kv.free(0);
    CHECK(pool.num_free() == 8);
}

TEST_CASE("kv cache manager: the victim is the highest priority value, the youngest among equals") {
    using C = KvCacheManager::Candidate;
    CHECK(KvCacheManager::choose_victim(std::span<const C>{}) == -1);
    const std::vector<C> equal = {{3, 0}, {7, 0}, {5, 0}};
    CHECK(KvCacheManager::choose_victim(equal) == 7);
    const std::vector<C> mixed = {{3, 2}, {7, 0}, {1, 2}, {9, -1}};
    CHECK(KvCacheManager::choose_victim(mixed) == 3);
}
