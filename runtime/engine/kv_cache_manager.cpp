// KvCacheManager (see kv_cache_manager.h).
#include "runtime/engine/kv_cache_manager.h"

namespace lattice {

bool KvCacheManager::allocate(int64_t seq, int64_t positions) {
    Table& t = tables_[seq];
    const int64_t need = blocks_for(positions) - int64_t(t.blocks.size());
    return need <= 0 || pool_.allocate(need, t.blocks);
}

int64_t KvCacheManager::admit_prefix(int64_t seq, std::span<const int32_t> tokens, uint64_t root) {
    Table& t = tables_[seq];
    if (t.blocks.empty() && t.registered == 0) t.chain = t.root = root;
    if (!pool_.prefix_caching()) return 0;
    const int64_t B = block_size();
    int64_t found_tokens = 0;
    // Full blocks only, and at least the last token left to compute (its logits are needed).
    for (int64_t b = int64_t(t.blocks.size()); (b + 1) * B <= int64_t(tokens.size()) - 1; ++b) {
        const std::span<const int32_t> blk = tokens.subspan(size_t(b * B), size_t(B));
        const uint64_t h = BlockPool::chain_hash(t.chain, blk);
        const int32_t found = pool_.lookup(h, t.blocks.empty() ? -1 : t.blocks.back(), blk, t.root);
        if (found < 0) break;
        t.blocks.push_back(found);
        t.chain = h;
        ++t.registered;
        found_tokens += B;
    }
    return found_tokens;
}

void KvCacheManager::register_full_blocks(int64_t seq, std::span<const int32_t> tokens, int64_t done) {
    if (!pool_.prefix_caching()) return;
    const auto it = tables_.find(seq);
    if (it == tables_.end()) return;
    Table& t = it->second;
    const int64_t B = block_size();
    for (int64_t b = t.registered; b < done / B && b < int64_t(t.blocks.size()); ++b) {
        const std::span<const int32_t> blk = tokens.subspan(size_t(b * B), size_t(B));
        const uint64_t h = BlockPool::chain_hash(t.chain, blk);
        pool_.register_full(t.blocks[size_t(b)], h, b > 0 ? t.blocks[size_t(b - 1)] : -1, blk, t.root);
        t.chain = h;
        t.registered = b + 1;
    }
}

void KvCacheManager::free(int64_t seq) {
    const auto it = tables_.find(seq);
    if (it == tables_.end()) return;
    pool_.release(it->second.blocks);
    tables_.erase(it);
}

std::span<const int32_t> KvCacheManager::blocks(int64_t seq) const {
    const auto it = tables_.find(seq);
    return it == tables_.end() ? std::span<const int32_t>{} : std::span<const int32_t>(it->second.blocks);
}

int64_t KvCacheManager::choose_victim(std::span<const Candidate> candidates) {
    const Candidate* best = nullptr;
    for (const Candidate& c : candidates)
        if (!best || c.priority > best->priority || (c.priority == best->priority && c.seq > best->seq)) best = &c;
    return best ? best->seq : -1;
}

}  // namespace lattice
