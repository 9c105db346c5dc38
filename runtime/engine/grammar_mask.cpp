// GrammarMatcher: configuration sets stepped byte by byte, and the token mask.
//
// A step moves every live configuration along its top state's byte edges and closes the result:
// epsilon edges replace the top, call edges replace it by the return state and push the callee, a
// kReturn state pops (at the bottom frame nothing is popped; kFinal there means "complete").
// States from which the frame can never end (Nfa::finish_bytes kNever: a branch of a regex through a
// class that matches nothing, a rule that only leads back to itself) are never entered, so every
// live configuration can still be completed and a mask is empty only when the output is complete.
// Configurations are deduplicated per closure (a linear scan: sets hold a handful), and a stack
// deeper than kMaxStack is dropped, which is what bounds nesting and makes recursion through
// calls that consume nothing terminate.
// The mask walks the vocabulary trie in preorder with one set per depth (grammar.h). Its floor is
// the walk itself: a full walk of the 128k trie steps ~400k nodes, so the cases that matter are the
// ones it avoids: pruning at the first dead byte (after '{' only the '"' and '}' subtrees survive),
// and the string body, where every configuration is at a body state and the precomputed plain sets
// answer all but the non-plain tokens. Scratch sets are thread_local so a mask allocates nothing
// once warm.
// Finishing: distance() in bytes from the compile-time costs (grammar_check.cpp); min_remaining_tokens()
// in tokens by a breadth-first search over sets with the vocabulary's tokens as edges (a trie walk per
// set, as for a mask), memoized per (vocabulary, set) in the DfaCache.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <unordered_map>

#include "base/error.h"
#include "runtime/engine/grammar.h"

namespace lattice {

namespace {

using grammar_detail::Configs;
using grammar_detail::DfaCache;
using grammar_detail::Nfa;

// Closes configurations into `out` with an explicit work list (epsilon chains of a large regex
// repetition are long; recursion would bound them by the thread's stack).
struct Closure {
    const Nfa& n;
    Configs& out;
    Configs& seen;
    Configs& work;
    std::vector<int32_t>& cur;
    bool complete = false;

    void expand(std::span<const int32_t> start) {
        work.clear();
        work.push(start);
        while (work.size() > 0) {
            const auto top = work.at(work.size() - 1);
            cur.assign(top.begin(), top.end());
            work.pop();
            visit();
        }
    }

private:
    void visit() {
        const int32_t s = cur.back();
        const size_t su = size_t(s);
        const bool has_eps = n.eps_off[su] != n.eps_off[su + 1], has_calls = n.call_off[su] != n.call_off[su + 1];
        const bool has_bytes = n.byte_off[su] != n.byte_off[su + 1];
        if (!has_eps && !has_calls && n.flags[su] == 0) {  // the common case: a plain byte state
            if (has_bytes && !out.contains(cur)) out.push(cur);
            return;
        }
        if (seen.contains(cur)) return;
        seen.push(cur);
        if (has_bytes) out.push(cur);
        if ((n.flags[su] & grammar_detail::kFinal) && cur.size() == 1) complete = true;
        if ((n.flags[su] & grammar_detail::kReturn) && cur.size() > 1)
            work.push(std::span<const int32_t>(cur.data(), cur.size() - 1));
        for (uint32_t e = n.eps_off[su]; e < n.eps_off[su + 1]; ++e) {
            if (n.finish_bytes[size_t(n.eps[e])] == grammar_detail::kNever) continue;  // a dead end
            cur.back() = n.eps[e];
            work.push(cur);
        }
        cur.back() = s;
        if (cur.size() >= size_t(grammar_detail::kMaxStack)) return;
        for (uint32_t e = n.call_off[su]; e < n.call_off[su + 1]; ++e) {
            if (n.finish_bytes[size_t(n.calls[e].callee)] == grammar_detail::kNever ||
                n.finish_bytes[size_t(n.calls[e].ret)] == grammar_detail::kNever)
                continue;
            cur.back() = n.calls[e].ret;
            cur.push_back(n.calls[e].callee);
            work.push(cur);
            cur.pop_back();
        }
        cur.back() = s;
    }
};

struct Scratch {
    std::vector<int32_t> levels;  // the set id at each trie depth
    Configs seen, tmp, work;
    std::vector<int32_t> cfg, cur;
};

Scratch& scratch() {
    thread_local Scratch s;
    return s;
}

// in --byte--> out (closed). Returns whether the result is complete.
bool step(const Nfa& n, const Configs& in, uint8_t b, Configs& out, Scratch& sc) {
    out.clear();
    sc.seen.clear();
    Closure cl{n, out, sc.seen, sc.work, sc.cur};
    for (int32_t i = 0; i < in.size(); ++i) {
        const int32_t s = in.top(i);
        for (uint32_t e = n.byte_off[size_t(s)]; e < n.byte_off[size_t(s) + 1]; ++e) {
            const grammar_detail::ByteEdge& ed = n.bytes[e];
            if (b < ed.lo || b > ed.hi) continue;
            if (n.finish_bytes[size_t(ed.to)] == grammar_detail::kNever) continue;  // no way on from there
            const auto c = in.at(i);
            sc.cfg.assign(c.begin(), c.end());
            sc.cfg.back() = ed.to;
            cl.expand(sc.cfg);
        }
    }
    return cl.complete;
}

// The fast path's bound for a set: the most characters a string body may still take when every
// configuration is at a body state, else -1.
int32_t body_bound(const Nfa& n, const Configs& c) {
    int32_t body = -1;
    for (int32_t i = 0; i < c.size(); ++i) {
        const int32_t r = n.body_remaining[size_t(c.top(i))];
        if (r < 0) return -1;
        body = std::max(body, r);
    }
    return body;
}

int32_t intern(DfaCache& dc, const Nfa& n, const Configs& c) {
    std::string key(reinterpret_cast<const char*>(c.off.data()), c.off.size() * sizeof(uint32_t));
    key.append(reinterpret_cast<const char*>(c.data.data()), c.data.size() * sizeof(int32_t));
    auto [it, fresh] = dc.ids.emplace(std::move(key), int32_t(dc.sets.size()));
    if (!fresh) return it->second;
    dc.sets.push_back(c);
    dc.body.push_back(body_bound(n, c));
    dc.trans.resize(dc.trans.size() + 256, -1);
    dc.dist.push_back(-1);
    return it->second;
}

// Set `id` --b--> (target + 1) << 1 | complete, computed once per grammar.
int32_t transition(DfaCache& dc, const Nfa& n, int32_t id, uint8_t b, Scratch& sc) {
    const size_t at = size_t(id) * 256 + b;
    if (dc.trans[at] >= 0) return dc.trans[at];
    const bool complete = step(n, dc.sets[size_t(id)], b, sc.tmp, sc);
    const int32_t target = sc.tmp.size() == 0 ? -1 : intern(dc, n, sc.tmp);
    dc.trans[at] = ((target + 1) << 1) | int32_t(complete);
    return dc.trans[at];
}

// One token's bytes from set `start`: (target + 1) << 1 | complete, as transition() for a byte.
int32_t token_transition(DfaCache& dc, const Nfa& n, int32_t start, const std::string& bytes, Scratch& sc) {
    int32_t at = start, last = 0;
    for (char c : bytes) {
        if (at < 0) break;
        last = transition(dc, n, at, uint8_t(c), sc);
        at = (last >> 1) - 1;
    }
    return last;
}

// The vocabulary-trie walk every mask shares: preorder from set `start`, one set per depth, a subtree
// skipped at its first byte that leads nowhere. on_node(node, v) sees each node some byte path reaches
// (v: the transition's (target + 1) << 1 | complete); the subtree below it is skipped when the target
// is none (complete, nothing can follow: no longer token fits).
template <class OnNode>
[[gnu::always_inline]] inline void walk_trie(DfaCache& dc, const Nfa& n, const grammar_detail::Trie& t, int32_t start, Scratch& sc,
               OnNode&& on_node) {
    if (sc.levels.size() < size_t(t.max_depth) + 1) sc.levels.resize(size_t(t.max_depth) + 1);
    sc.levels[0] = start;
    const uint32_t nodes = uint32_t(t.byte.size());
    for (uint32_t i = 1; i < nodes;) {
        const int d = t.depth[i];
        const int32_t v = transition(dc, n, sc.levels[size_t(d - 1)], t.byte[i], sc);
        const int32_t target = (v >> 1) - 1;
        if (target < 0 && !(v & 1)) {
            i = t.end[i];
            continue;
        }
        on_node(i, v);
        if (target < 0) {
            i = t.end[i];
            continue;
        }
        sc.levels[size_t(d)] = target;
        ++i;
    }
}

// The mask: the bit of every token at a reached node.
void walk(DfaCache& dc, const Nfa& n, const grammar_detail::Trie& t, int32_t start, std::span<uint32_t> words,
          Scratch& sc) {
    uint32_t* const w = words.data();
    walk_trie(dc, n, t, start, sc, [&t, w](uint32_t i, int32_t) {
        for (uint32_t k = t.tok_off[i]; k < t.tok_off[i + 1]; ++k) {
            const int32_t id = t.toks[k];
            w[size_t(id / 32)] |= 1u << (id % 32);
        }
    });
}

// Bytes of the shortest completion from set `id`: the least over its configurations of the sum of
// their frames' Nfa::finish_bytes (grammar_check.cpp), memoized per set; INT32_MAX when none ends.
int32_t distance(DfaCache& dc, const Nfa& n, int32_t id, Scratch&) {
    if (dc.dist[size_t(id)] >= 0) return dc.dist[size_t(id)];
    const Configs& c = dc.sets[size_t(id)];
    int64_t best = grammar_detail::kNever;
    for (int32_t i = 0; i < c.size(); ++i) {
        int64_t sum = 0;
        for (int32_t s : c.at(i)) {
            const int32_t f = n.finish_bytes[size_t(s)];
            if (f == grammar_detail::kNever) {
                sum = grammar_detail::kNever;
                break;
            }
            sum += f;
        }
        best = std::min(best, sum);
    }
    dc.dist[size_t(id)] = int32_t(std::min<int64_t>(best, grammar_detail::kNever));
    return dc.dist[size_t(id)];
}

// The distinct sets one token leads to from set `start` (the trie walk of walk(), recording each
// token's target instead of its bit: walk_trie with another visitor); whether some token completes the output.
bool token_targets(DfaCache& dc, const Nfa& n, const grammar_detail::Trie& t, int32_t start,
                   std::vector<int32_t>& out, Scratch& sc) {
    bool completes = false;
    out.clear();
    walk_trie(dc, n, t, start, sc, [&](uint32_t i, int32_t v) {
        if (t.tok_off[i] == t.tok_off[i + 1]) return;
        completes |= (v & 1) != 0;
        const int32_t target = (v >> 1) - 1;
        if (target >= 0 && std::find(out.begin(), out.end(), target) == out.end()) out.push_back(target);
    });
    return completes;
}

// Tokens of the shortest completion from set `id`: a breadth-first search over sets with tokens as
// edges (each expansion a trie walk), level by level until a completion is found; then a backward pass
// over the explored sets gives each its own distance, memoized per (vocabulary, set) where it is
// provably exact (no shorter way can leave the explored levels), so the sets along the way answer at
// once later. Past kMaxExpand expansions it gives up and answers the least of the best completion found
// and the byte distance, an upper bound wherever every byte is a token (byte-level BPE; SentencePiece
// with byte fallback), memoized too so a long document does not search again. With `limit`, the search
// stops past that many tokens and answers limit + 1 when no completion is that close (not memoized).
// A set is never complete by itself (its caller knows), so the answer is >= 1.
int32_t token_distance(DfaCache& dc, const Nfa& n, const TokenVocab& v, int32_t id, Scratch& sc,
                       int64_t limit = grammar_detail::kNever) {
    constexpr int kMaxExpand = 256;
    constexpr int64_t kNone = grammar_detail::kNever;
    const auto key = [&](int32_t set) { return uint64_t(v.serial()) << 32 | uint32_t(set); };
    if (auto it = dc.tok_dist.find(key(id)); it != dc.tok_dist.end()) return it->second;
    struct Node {
        int32_t set, depth;
        int64_t dist = kNone;  // known (memo) or being computed
        bool expanded = false, completes = false;
        std::vector<int32_t> succ;  // node indices
    };
    std::vector<Node> nodes{{id, 0}};
    std::unordered_map<int32_t, int32_t> index{{id, 0}};
    std::vector<int32_t> targets;
    int64_t best = kNone;
    int32_t last_level = -1;
    int expanded = 0;
    for (size_t begin = 0; begin < nodes.size();) {
        const size_t end = nodes.size();
        const int32_t depth = nodes[begin].depth;
        for (size_t i = begin; i < end; ++i) {
            if (i != 0)
                if (auto it = dc.tok_dist.find(key(nodes[i].set)); it != dc.tok_dist.end()) {
                    nodes[i].dist = it->second;
                    best = std::min<int64_t>(best, depth + int64_t(it->second));
                    continue;
                }
            if (++expanded > kMaxExpand) {
                const int32_t r = int32_t(std::min<int64_t>(best, distance(dc, n, id, sc)));
                dc.tok_dist.emplace(key(id), r);
                return r;
            }
            nodes[i].expanded = true;
            nodes[i].completes = token_targets(dc, n, v.trie(), nodes[i].set, targets, sc);
            if (nodes[i].completes) best = std::min<int64_t>(best, depth + 1);
            for (int32_t t : targets) {
                const auto [it, fresh] = index.emplace(t, int32_t(nodes.size()));
                if (fresh) nodes.push_back({t, depth + 1});
                nodes[i].succ.push_back(it->second);
            }
        }
        last_level = depth;
        begin = end;
        if (best <= depth + 1) break;
        if (depth + 1 >= limit && best > limit) return int32_t(limit + 1);  // nothing within the limit
    }
    // Backward: each expanded set's distance within the explored part (a few rounds: cycles are rare).
    for (Node& u : nodes)
        if (u.expanded) u.dist = u.completes ? 1 : kNone;
    for (bool changed = true; changed;) {
        changed = false;
        for (Node& u : nodes) {
            if (!u.expanded) continue;
            for (int32_t j : u.succ)
                if (nodes[size_t(j)].dist != kNone && nodes[size_t(j)].dist + 1 < u.dist) {
                    u.dist = nodes[size_t(j)].dist + 1;
                    changed = true;
                }
        }
    }
    // A way through a set never expanded (depth > last_level) takes at least last_level + 2 - depth.
    for (const Node& u : nodes)
        if (u.expanded && u.dist != kNone && u.dist <= int64_t(last_level) + 2 - u.depth)
            dc.tok_dist.emplace(key(u.set), int32_t(u.dist));
    const int32_t r = int32_t(std::min<int64_t>(nodes[0].dist, kNone));
    dc.tok_dist.emplace(key(id), r);
    return r;
}

}  // namespace

int32_t GrammarMatcher::distance() const {
    if (complete_) return 0;
    if (live_.size() == 0) return INT32_MAX;
    DfaCache& dc = grammar_->cache();
    std::lock_guard<std::mutex> lock(dc.mu);
    if (dc.sets.size() > DfaCache::kMaxSets) dc.clear();
    return ::lattice::distance(dc, grammar_->nfa(), intern(dc, grammar_->nfa(), live_), scratch());
}

int32_t GrammarMatcher::min_remaining_tokens() const {
    if (complete_) return 0;
    if (live_.size() == 0) return INT32_MAX;
    DfaCache& dc = grammar_->cache();
    std::lock_guard<std::mutex> lock(dc.mu);
    if (dc.sets.size() > DfaCache::kMaxSets) dc.clear();
    return token_distance(dc, grammar_->nfa(), *vocab_, intern(dc, grammar_->nfa(), live_), scratch());
}

void GrammarMatcher::fill_mask_within(std::span<uint32_t> words, int64_t tokens_left) const {
    fill_mask(words);
    const TokenVocab& v = *vocab_;
    if (live_.size() == 0 || tokens_left <= 0) return;  // nothing can follow, or nothing is left to promise
    const Nfa& n = grammar_->nfa();
    DfaCache& dc = grammar_->cache();
    std::lock_guard<std::mutex> lock(dc.mu);
    if (dc.sets.size() > DfaCache::kMaxSets) dc.clear();
    Scratch& sc = scratch();
    const int32_t start = intern(dc, n, live_);
    const int64_t need = tokens_left - 1;
    // Inside an unbounded string body a plain token leads back to this set, or at most 3 bytes short of
    // a character boundary: far enough from the end they are all kept at once (not walked one by one).
    const bool bulk_plain = dc.body[size_t(start)] == INT32_MAX && v.has_all_bytes() &&
                            int64_t(::lattice::distance(dc, n, start, sc)) + 3 <= need;
    const auto plain = v.plain_upto(grammar_detail::kPlainMaxChars);
    std::vector<uint32_t> kept(words.begin(), words.end());
    bool any = false;
    for (size_t w = 0; w < words.size(); ++w) {
        for (uint32_t bits = words[w]; bits != 0; bits &= bits - 1) {
            const int32_t id = int32_t(w * 32) + __builtin_ctz(bits);
            if (bulk_plain && (plain[w] >> (id % 32) & 1u)) {
                any = true;
                continue;
            }
            if (v.is_end(id)) {
                any = true;
                continue;
            }
            const int32_t last = token_transition(dc, n, start, v.bytes(id), sc), at = (last >> 1) - 1;
            // Bytes bound tokens from above where every byte is a token: the search only near the end.
            const bool keep = (last & 1) ||
                              (at >= 0 && need >= 1 &&
                               ((v.has_all_bytes() && int64_t(::lattice::distance(dc, n, at, sc)) <= need) ||
                                int64_t(token_distance(dc, n, v, at, sc, need)) <= need));
            if (keep)
                any = true;
            else
                kept[w] &= ~(1u << (id % 32));
        }
    }
    // No token keeps the promise (tokens_left is below the shortest completion): the plain mask stands.
    if (any) std::copy(kept.begin(), kept.end(), words.begin());
}

void GrammarMatcher::fill_mask_finishing(std::span<uint32_t> words) const {
    fill_mask(words);
    const TokenVocab& v = *vocab_;
    if (complete_) {  // end now
        std::fill(words.begin(), words.end(), 0u);
        for (int32_t id : v.end_ids()) words[size_t(id / 32)] |= 1u << (id % 32);
        return;
    }
    if (live_.size() == 0) return;
    const Nfa& n = grammar_->nfa();
    DfaCache& dc = grammar_->cache();
    std::lock_guard<std::mutex> lock(dc.mu);
    Scratch& sc = scratch();
    const int32_t start = intern(dc, n, live_);
    const int32_t here = ::lattice::distance(dc, n, start, sc);
    for (size_t w = 0; w < words.size(); ++w) {
        for (uint32_t bits = words[w]; bits != 0; bits &= bits - 1) {
            const int32_t id = int32_t(w * 32) + __builtin_ctz(bits);
            if (v.is_end(id)) continue;
            const int32_t last = token_transition(dc, n, start, v.bytes(id), sc), at = (last >> 1) - 1;
            const bool keep = (last & 1) || (at >= 0 && ::lattice::distance(dc, n, at, sc) < here);
            if (!keep) words[w] &= ~(1u << (id % 32));
        }
    }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v)
    : grammar_(std::move(g)), vocab_(std::move(v)) {
    LATTICE_CHECK(grammar_ && vocab_, "GrammarMatcher: a grammar and a vocabulary are required");
    Scratch& sc = scratch();
    sc.seen.clear();
    const std::vector<int32_t> cfg{grammar_->nfa().start};
    Closure cl{grammar_->nfa(), live_, sc.seen, sc.work, sc.cur};
    cl.expand(cfg);
    complete_ = cl.complete;
}

void GrammarMatcher::fill_mask(std::span<uint32_t> words) const {
    const TokenVocab& v = *vocab_;
    LATTICE_CHECK(words.size() == size_t((v.size() + 31) / 32),
                  "GrammarMatcher::fill_mask: {} words for a vocabulary of {}", words.size(), v.size());
    std::fill(words.begin(), words.end(), 0u);
    const Nfa& n = grammar_->nfa();
    if (live_.size() > 0) {
        DfaCache& dc = grammar_->cache();
        std::lock_guard<std::mutex> lock(dc.mu);
        if (dc.sets.size() > DfaCache::kMaxSets) dc.clear();
        if (dc.masks.size() > DfaCache::kMaxMasks) dc.masks.clear();
        const int32_t id = intern(dc, n, live_);
        const uint64_t key = uint64_t(v.serial()) << 32 | uint32_t(id);
        auto memo = dc.masks.find(key);
        if (memo != dc.masks.end()) {
            std::copy(memo->second.begin(), memo->second.end(), words.begin());
        } else {
            const auto t0 = std::chrono::steady_clock::now();
            Scratch& sc = scratch();
            const int32_t body = dc.body[size_t(id)];
            if (body >= 0) {  // every configuration in a string body: plain tokens are precomputed
                const auto plain = v.plain_upto(std::min(body, grammar_detail::kPlainMaxChars));
                std::copy(plain.begin(), plain.end(), words.begin());
                walk(dc, n, v.nonplain_trie(), id, words, sc);
            } else {
                walk(dc, n, v.trie(), id, words, sc);
            }
            if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(50))
                dc.masks.emplace(key, std::vector<uint32_t>(words.begin(), words.end()));
        }
    }
    bool any = false;
    for (uint32_t w : words) any |= w != 0;
    if (complete_ || !any)
        for (int32_t id : v.end_ids()) words[size_t(id / 32)] |= 1u << (id % 32);
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
    const Nfa& n = grammar_->nfa();
    Scratch& sc = scratch();
    Configs cur = live_, next;
    bool complete = complete_;
    for (char c : bytes) {
        if (cur.size() == 0) return false;
        complete = step(n, cur, uint8_t(c), next, sc);
        if (next.size() == 0 && !complete) return false;
        std::swap(cur, next);
    }
    live_ = std::move(cur);
    complete_ = complete;
    return true;
}

bool GrammarMatcher::accept(int32_t id) {
    if (id < 0 || id >= vocab_->size()) return false;
    if (vocab_->is_end(id)) return complete_;
    const std::string& b = vocab_->bytes(id);
    if (b.empty()) return false;
    return accept_bytes(b);
}

}  // namespace lattice
