// GrammarMatcher: configuration sets stepped byte by byte, and the token mask.
//
// A step moves every live configuration along its top state's byte edges and closes the result:
// epsilon edges replace the top, call edges replace it by the return state and push the callee, a
// kReturn state pops (at the bottom frame nothing is popped; kFinal there means "complete").
// Configurations are deduplicated per closure (a linear scan: sets hold a handful), and a stack
// deeper than kMaxStack is dropped, which is what bounds nesting and makes recursion through
// calls that consume nothing terminate.
// The mask walks the vocabulary trie in preorder with one set per depth (grammar.h). Its floor is
// the walk itself: a full walk of the 128k trie steps ~400k nodes, so the cases that matter are the
// ones it avoids: pruning at the first dead byte (after '{' only the '"' and '}' subtrees survive),
// and the string body, where every configuration is at a body state and the precomputed plain sets
// answer all but the non-plain tokens. Scratch sets are thread_local so a mask allocates nothing
// once warm.
#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "runtime/engine/grammar.h"

namespace lattice {

namespace {

using grammar_detail::Configs;
using grammar_detail::Nfa;

struct Closure {
    const Nfa& n;
    Configs& out;
    Configs& seen;
    bool complete = false;

    void expand(std::vector<int32_t>& cfg) {
        const int32_t s = cfg.back();
        const size_t su = size_t(s);
        const bool has_eps = n.eps_off[su] != n.eps_off[su + 1], has_calls = n.call_off[su] != n.call_off[su + 1];
        if (!has_eps && !has_calls && n.flags[su] == 0) {  // the common case: a plain byte state
            if (n.byte_off[su] != n.byte_off[su + 1] && !out.contains(cfg)) out.push(cfg);
            return;
        }
        if (seen.contains(cfg)) return;
        seen.push(cfg);
        if (n.byte_off[su] != n.byte_off[su + 1]) out.push(cfg);
        if ((n.flags[su] & grammar_detail::kFinal) && cfg.size() == 1) complete = true;
        if ((n.flags[su] & grammar_detail::kReturn) && cfg.size() > 1) {
            cfg.pop_back();
            expand(cfg);
            cfg.push_back(s);
        }
        for (uint32_t e = n.eps_off[su]; e < n.eps_off[su + 1]; ++e) {
            cfg.back() = n.eps[e];
            expand(cfg);
        }
        cfg.back() = s;
        if (cfg.size() >= size_t(grammar_detail::kMaxStack)) return;
        for (uint32_t e = n.call_off[su]; e < n.call_off[su + 1]; ++e) {
            cfg.back() = n.calls[e].ret;
            cfg.push_back(n.calls[e].callee);
            expand(cfg);
            cfg.pop_back();
        }
        cfg.back() = s;
    }
};

struct Scratch {
    std::vector<Configs> levels;
    Configs seen, tmp;
    std::vector<int32_t> cfg;
};

Scratch& scratch() {
    thread_local Scratch s;
    return s;
}

// in --byte--> out (closed). Returns whether the result is complete.
bool step(const Nfa& n, const Configs& in, uint8_t b, Configs& out, Scratch& sc) {
    out.clear();
    sc.seen.clear();
    Closure cl{n, out, sc.seen};
    for (int32_t i = 0; i < in.size(); ++i) {
        const int32_t s = in.top(i);
        for (uint32_t e = n.byte_off[size_t(s)]; e < n.byte_off[size_t(s) + 1]; ++e) {
            const grammar_detail::ByteEdge& ed = n.bytes[e];
            if (b < ed.lo || b > ed.hi) continue;
            const auto c = in.at(i);
            sc.cfg.assign(c.begin(), c.end());
            sc.cfg.back() = ed.to;
            cl.expand(sc.cfg);
        }
    }
    return cl.complete;
}

void walk(const Nfa& n, const grammar_detail::Trie& t, const Configs& start, std::span<uint32_t> words, Scratch& sc) {
    if (sc.levels.size() < size_t(t.max_depth) + 1) sc.levels.resize(size_t(t.max_depth) + 1);
    const uint32_t nodes = uint32_t(t.byte.size());
    for (uint32_t i = 1; i < nodes;) {
        const int d = t.depth[i];
        const Configs& parent = d == 1 ? start : sc.levels[size_t(d - 1)];
        Configs& here = sc.levels[size_t(d)];
        const bool complete = step(n, parent, t.byte[i], here, sc);
        if (here.size() == 0 && !complete) {
            i = t.end[i];
            continue;
        }
        for (uint32_t k = t.tok_off[i]; k < t.tok_off[i + 1]; ++k) {
            const int32_t id = t.toks[k];
            words[size_t(id / 32)] |= 1u << (id % 32);
        }
        i = here.size() == 0 ? t.end[i] : i + 1;  // complete and nothing can follow: no longer token fits
    }
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v)
    : grammar_(std::move(g)), vocab_(std::move(v)) {
    LATTICE_CHECK(grammar_ && vocab_, "GrammarMatcher: a grammar and a vocabulary are required");
    Scratch& sc = scratch();
    sc.seen.clear();
    std::vector<int32_t> cfg{grammar_->nfa().start};
    Closure cl{grammar_->nfa(), live_, sc.seen};
    cl.expand(cfg);
    complete_ = cl.complete;
}

void GrammarMatcher::fill_mask(std::span<uint32_t> words) const {
    const TokenVocab& v = *vocab_;
    LATTICE_CHECK(words.size() == size_t((v.size() + 31) / 32),
                  "GrammarMatcher::fill_mask: {} words for a vocabulary of {}", words.size(), v.size());
    std::fill(words.begin(), words.end(), 0u);
    const Nfa& n = grammar_->nfa();
    Scratch& sc = scratch();
    int32_t body = -1;  // the most characters any configuration's string body may still take, if all are in one
    for (int32_t i = 0; i < live_.size(); ++i) {
        const int32_t r = n.body_remaining[size_t(live_.top(i))];
        if (r < 0) {
            body = -1;
            break;
        }
        body = std::max(body, r);
    }
    if (body >= 0) {
        const auto plain = v.plain_upto(std::min(body, grammar_detail::kPlainMaxChars));
        for (size_t w = 0; w < words.size(); ++w) words[w] = plain[w];
        walk(n, v.nonplain_trie(), live_, words, sc);
    } else if (live_.size() > 0) {
        walk(n, v.trie(), live_, words, sc);
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
