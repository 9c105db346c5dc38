// BlockPool: the leader's bookkeeping of the paged KV cache (no memory here: every rank holds the
// blocks themselves, [num_blocks, block_size, kv_heads, head_dim] per layer, and follows the block
// tables of the step plans).
//
// Blocks are reference counted. A block whose count drops to 0 goes to the free list; with prefix
// caching a full block also stays findable by the hash of its tokens (and of every token before
// it) until it is reallocated, least recently freed first; a sequence's blocks are freed tail first,
// so the head of a prefix, which every lookup needs, is evicted last. lookup() revives such a block (or shares
// a live one) for a sequence whose prompt starts with the same tokens, so shared system prompts are
// computed once.
// Invariant (checked by tests after every run): when no sequence holds a block, num_free() ==
// num_blocks().
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace lattice {

class BlockPool {
public:
    BlockPool(int64_t num_blocks, int64_t block_size, bool prefix_caching);

    int64_t num_blocks() const { return int64_t(ref_.size()); }
    int64_t block_size() const { return block_size_; }
    bool prefix_caching() const { return prefix_caching_; }
    // Blocks allocate() can hand out now (free ones, cached ones included).
    int64_t num_free() const { return int64_t(free_.size()); }
    int64_t num_used() const { return num_blocks() - num_free(); }

    // Appends n blocks to `out` (reference count 1), evicting cached free blocks least recently
    // freed first. Returns false and allocates nothing when fewer than n are free.
    bool allocate(int64_t n, std::vector<int32_t>& out);
    // Drops one reference of each block; those freed go to the free list tail first (`blocks` in a
    // sequence's order: its head block is evicted last).
    void release(std::span<const int32_t> blocks);

    // Prefix caching. The hash of a full block chains the hash of the block before it (0 for the
    // first), so equal hashes mean equal prefixes.
    static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);
    // The cached block holding exactly `tokens` after the block `parent` (-1: at the start), with
    // one more reference, or -1. Verifies tokens, parent and root (the chain's key: a LoRA adapter's, 0
    // for the base), so a hash collision cannot alias.
    int32_t lookup(uint64_t hash, int32_t parent, std::span<const int32_t> tokens, uint64_t root = 0);
    // Records that `block` (referenced, full) holds `tokens` after `parent`, findable by `hash`.
    // A block already cached under that hash keeps the entry.
    void register_full(int32_t block, uint64_t hash, int32_t parent, std::span<const int32_t> tokens,
                       uint64_t root = 0);

    int64_t cache_hits() const { return hits_; }  // blocks found by lookup()

private:
    struct Cached {
        uint64_t hash = 0;
        int32_t parent = -1;
        uint64_t root = 0;
        std::vector<int32_t> tokens;
        bool valid = false;
    };
    void take_from_free(int32_t b);
    void evict(int32_t b);

    int64_t block_size_;
    bool prefix_caching_;
    std::vector<int32_t> ref_;
    std::list<int32_t> free_;  // front: allocated first (least recently freed)
    std::vector<std::list<int32_t>::iterator> free_pos_;
    std::vector<bool> in_free_;
    std::vector<Cached> cached_;
    std::unordered_map<uint64_t, int32_t> index_;
    int64_t hits_ = 0;
};

}  // namespace lattice
