// BlockPool (see block_pool.h).
#include "runtime/engine/block_pool.h"

#include <algorithm>

#include "base/error.h"

namespace lattice {

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching) {
    LATTICE_CHECK(num_blocks >= 1 && num_blocks <= INT32_MAX, "KV cache: {} blocks (need 1 .. 2^31-1)", num_blocks);
    LATTICE_CHECK(block_size >= 1, "KV cache: block size {} (need >= 1)", block_size);
    ref_.assign(size_t(num_blocks), 0);
    free_pos_.resize(size_t(num_blocks));
    in_free_.assign(size_t(num_blocks), true);
    cached_.resize(prefix_caching ? size_t(num_blocks) : 0);
    for (int32_t b = 0; b < int32_t(num_blocks); ++b) free_pos_[size_t(b)] = free_.insert(free_.end(), b);
}

void BlockPool::take_from_free(int32_t b) {
    free_.erase(free_pos_[size_t(b)]);
    in_free_[size_t(b)] = false;
}

void BlockPool::evict(int32_t b) {
    if (!prefix_caching_ || !cached_[size_t(b)].valid) return;
    Cached& c = cached_[size_t(b)];
    auto it = index_.find(c.hash);
    if (it != index_.end() && it->second == b) index_.erase(it);
    c = Cached{};
}

bool BlockPool::allocate(int64_t n, std::vector<int32_t>& out) {
    if (n > num_free()) return false;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t b = free_.front();
        take_from_free(b);
        evict(b);  // its old contents are about to be overwritten
        ref_[size_t(b)] = 1;
        out.push_back(b);
    }
    return true;
}

// A sequence's blocks go back tail first: the free list is used from its front, so the tail of a
// cached prefix is evicted before its head, which every later lookup of the prefix needs first (a
// block is only found after its parent). vLLM's free queue does the same.
void BlockPool::release(std::span<const int32_t> blocks) {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
        const int32_t b = *it;
        LATTICE_CHECK(b >= 0 && b < int32_t(ref_.size()) && ref_[size_t(b)] > 0,
                      "KV cache: release of block {} that is not held", b);
        if (--ref_[size_t(b)] == 0) {
            free_pos_[size_t(b)] = free_.insert(free_.end(), b);
            in_free_[size_t(b)] = true;
        }
    }
}

uint64_t BlockPool::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
    // FNV-1a over the parent hash and the tokens, then a splitmix finalizer.
    uint64_t h = 1469598103934665603ull ^ parent;
    for (int32_t t : tokens) {
        h ^= uint64_t(uint32_t(t));
        h *= 1099511628211ull;
    }
    h ^= h >> 31;
    h *= 0x7fb5d329728ea185ull;
    h ^= h >> 27;
    return h;
}

int32_t BlockPool::lookup(uint64_t hash, int32_t parent, std::span<const int32_t> tokens, uint64_t root) {
    if (!prefix_caching_) return -1;
    auto it = index_.find(hash);
    if (it == index_.end()) return -1;
    const int32_t b = it->second;
    const Cached& c = cached_[size_t(b)];
    if (!c.valid || c.parent != parent || c.root != root || !std::equal(c.tokens.begin(), c.tokens.end(), tokens.begin(), tokens.end()))
        return -1;
    if (in_free_[size_t(b)]) take_from_free(b);
    ++ref_[size_t(b)];
    ++hits_;
    return b;
}

void BlockPool::register_full(int32_t block, uint64_t hash, int32_t parent, std::span<const int32_t> tokens,
                              uint64_t root) {
    if (!prefix_caching_) return;
    LATTICE_CHECK(
        block >= 0 && block < int32_t(ref_.size()) && ref_[size_t(block)] > 0 && int64_t(tokens.size()) == block_size_,
        "KV cache: register of block {} ({} tokens)", block, tokens.size());
    if (index_.count(hash)) return;
    Cached& c = cached_[size_t(block)];
    if (c.valid) evict(block);
    c.hash = hash;
    c.parent = parent;
    c.root = root;
    c.tokens.assign(tokens.begin(), tokens.end());
    c.valid = true;
    index_[hash] = block;
}

}  // namespace lattice
