// KvCacheManager: the leader's per-sequence view of the paged KV cache, over BlockPool (vLLM v1's
// KVCacheManager over its BlockPool). The scheduler decides which sequences run and how many tokens
// each computes; this class decides which blocks they hold:
//   - allocation: a sequence's block table grows as its positions are reached (all or nothing);
//   - prefix caching: an admitted prompt takes the cached full blocks of an identical prefix
//     (admit_prefix), and a sequence's full blocks are registered as their K/V complete
//     (register_full_blocks), each block's hash chaining the one before it;
//   - preemption choices: when the pool runs short, choose_victim picks which preemptible sequence
//     gives its blocks back (the highest priority value, the youngest among equals).
// Invariants: a sequence's table holds exactly the blocks it references (one reference each); free()
// returns them all, so when no sequence is known num_free() == num_blocks() of the pool; at least the
// last token of a prompt is never taken from the cache (its logits are needed); registered blocks
// are full and form a prefix of the table.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/engine/block_pool.h"

namespace lattice {

class KvCacheManager {
public:
    explicit KvCacheManager(BlockPool& pool) : pool_(pool) {}

    const BlockPool& pool() const { return pool_; }
    int64_t block_size() const { return pool_.block_size(); }
    // Blocks `positions` positions take.
    int64_t blocks_for(int64_t positions) const { return (positions + block_size() - 1) / block_size(); }

    // Grows the table of `seq` to hold `positions` positions. False (and nothing allocated) when the
    // pool has too few free blocks.
    bool allocate(int64_t seq, int64_t positions);
    // The cached full blocks of the prefix of `tokens` (never its last token) into the (empty) table of
    // `seq`; returns the tokens they hold (a multiple of the block size; 0 without prefix caching).
    // `root` keys the chain's start (the LoRA adapter's key; 0: the base model): K/V computed under one
    // adapter are never found by a sequence of another.
    int64_t admit_prefix(int64_t seq, std::span<const int32_t> tokens, uint64_t root = 0);
    // Registers the full blocks of `seq` within its first `done` tokens (of `tokens`) in the prefix cache.
    void register_full_blocks(int64_t seq, std::span<const int32_t> tokens, int64_t done);
    // Every block of `seq` back to the pool (its tail first: its head, which lookups need, is evicted last).
    void free(int64_t seq);
    std::span<const int32_t> blocks(int64_t seq) const;

    // Preemption: the sequence that gives its blocks back first among `candidates` (those the scheduler
    // may preempt now): the highest priority value, the youngest (largest id) among equals; -1 if none.
    struct Candidate {
        int64_t seq = 0;
        int64_t priority = 0;
    };
    static int64_t choose_victim(std::span<const Candidate> candidates);

private:
    struct Table {
        std::vector<int32_t> blocks;
        int64_t registered = 0;  // full blocks in the prefix cache (a prefix of blocks)
        uint64_t chain = 0;      // hash of the last registered block (the root before the first)
        uint64_t root = 0;       // admit_prefix's root
    };
    BlockPool& pool_;
    std::unordered_map<int64_t, Table> tables_;
};

}  // namespace lattice
