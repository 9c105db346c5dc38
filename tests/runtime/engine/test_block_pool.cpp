// BlockPool (runtime/engine/block_pool.h): allocation all-or-nothing, reference counts, release
// errors, least-recently-freed reuse, and the prefix cache: a cached full block is found only for
// the same tokens after the same parent, revived from the free list, shared with a count, and
// forgotten once its block is reallocated.
#include <doctest/doctest.h>

#include <vector>

#include "base/error.h"
#include "runtime/engine/block_pool.h"

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

TEST_CASE("without prefix caching nothing is cached") {
    BlockPool p(2, 2, false);
    std::vector<int32_t> a;
    REQUIRE(p.allocate(1, a));
    const std::vector<int32_t> t = {7, 8};
    p.register_full(a[0], BlockPool::chain_hash(0, t), -1, t);
    CHECK(p.lookup(BlockPool::chain_hash(0, t), -1, t) == -1);
}
