// What a compiled grammar can still produce, computed once per grammar from its Nfa alone:
//   finish_bytes[s]  bytes of the shortest way from state s to the end of its frame (its rule's
//                    kReturn state, or kFinal at the bottom), calls included (callee's shortest
//                    body + the rest after the return); kNever when there is none;
//   finish_depth     frames the shortest-nesting way to the end needs above the current one.
// Both are least fixpoints of monotone "superior" functions (a byte edge adds 1, a call adds the
// callee's and the continuation's costs, or takes the deeper of 1 + callee and continuation), so
// Knuth's generalisation of Dijkstra settles each state once from the frame ends backwards.
// check_finite() refuses a grammar that admits no finite output: a rule that cannot end (a $ref
// loop, anyOf of itself, an object requiring itself, a regex class that matches nothing), or an
// output that needs more nesting than a configuration holds (kMaxStack). distance() of a matcher is
// then a sum over its frames (grammar_mask.cpp), exact for outputs within the nesting bound.
#include <fmt/format.h>

#include <queue>

#include "base/error.h"
#include "runtime/engine/grammar.h"

namespace lattice::grammar_detail {

namespace {

// Predecessors of each state in compressed form: p is listed under t when p has a byte or epsilon
// edge to t, or a call edge whose callee or continuation is t.
struct Reverse {
    std::vector<uint32_t> off;
    std::vector<int32_t> from;
};

Reverse reverse_edges(const Nfa& n) {
    const size_t ns = size_t(n.num_states());
    Reverse r;
    r.off.assign(ns + 1, 0);
    auto each = [&](auto&& f) {
        for (size_t s = 0; s < ns; ++s) {
            for (uint32_t e = n.byte_off[s]; e < n.byte_off[s + 1]; ++e) f(int32_t(s), n.bytes[e].to);
            for (uint32_t e = n.eps_off[s]; e < n.eps_off[s + 1]; ++e) f(int32_t(s), n.eps[e]);
            for (uint32_t e = n.call_off[s]; e < n.call_off[s + 1]; ++e) {
                f(int32_t(s), n.calls[e].callee);
                f(int32_t(s), n.calls[e].ret);
            }
        }
    };
    each([&](int32_t, int32_t t) { ++r.off[size_t(t) + 1]; });
    for (size_t i = 0; i < ns; ++i) r.off[i + 1] += r.off[i];
    r.from.resize(r.off[ns]);
    std::vector<uint32_t> fill(r.off.begin(), r.off.end() - 1);
    each([&](int32_t s, int32_t t) { r.from[fill[size_t(t)]++] = s; });
    return r;
}

// Settles value[s] = min over s's edges of: byte -> add_byte(value[to]); epsilon -> value[to];
// call -> combine(value[callee], value[ret]); 0 at frame ends. kNever: unreachable end.
template <class AddByte, class Combine>
std::vector<int32_t> settle(const Nfa& n, const Reverse& r, AddByte add_byte, Combine combine) {
    const size_t ns = size_t(n.num_states());
    std::vector<int32_t> value(ns, kNever);
    std::vector<uint8_t> done(ns, 0);
    using Item = std::pair<int32_t, int32_t>;  // (value, state)
    std::priority_queue<Item, std::vector<Item>, std::greater<>> pq;
    for (size_t s = 0; s < ns; ++s)
        if (n.flags[s] & (kReturn | kFinal)) {
            value[s] = 0;
            pq.emplace(0, int32_t(s));
        }
    auto eval = [&](size_t s) {
        int32_t best = (n.flags[s] & (kReturn | kFinal)) ? 0 : kNever;
        for (uint32_t e = n.byte_off[s]; e < n.byte_off[s + 1]; ++e)
            if (value[size_t(n.bytes[e].to)] != kNever) best = std::min(best, add_byte(value[size_t(n.bytes[e].to)]));
        for (uint32_t e = n.eps_off[s]; e < n.eps_off[s + 1]; ++e) best = std::min(best, value[size_t(n.eps[e])]);
        for (uint32_t e = n.call_off[s]; e < n.call_off[s + 1]; ++e) {
            const int32_t a = value[size_t(n.calls[e].callee)], b = value[size_t(n.calls[e].ret)];
            if (a != kNever && b != kNever) best = std::min(best, combine(a, b));
        }
        return best;
    };
    while (!pq.empty()) {
        const auto [v, t] = pq.top();
        pq.pop();
        if (done[size_t(t)] || v != value[size_t(t)]) continue;
        done[size_t(t)] = 1;
        for (uint32_t i = r.off[size_t(t)]; i < r.off[size_t(t) + 1]; ++i) {
            const size_t p = size_t(r.from[i]);
            if (done[p]) continue;
            const int32_t nv = eval(p);
            if (nv < value[p]) {
                value[p] = nv;
                pq.emplace(nv, int32_t(p));
            }
        }
    }
    return value;
}

}  // namespace

void analyze(Nfa& n) {
    const Reverse r = reverse_edges(n);
    auto sat_add = [](int64_t a, int64_t b) { return int32_t(std::min<int64_t>(a + b, kNever - 1)); };
    n.finish_bytes = settle(
        n, r, [&](int32_t v) { return sat_add(v, 1); }, [&](int32_t a, int32_t b) { return sat_add(a, b); });
    // Frames above the current one; anything past kMaxStack is as good as never.
    n.finish_depth = settle(
        n, r, [](int32_t v) { return v; },
        [](int32_t a, int32_t b) { return a + 1 > kMaxStack ? kNever : std::max(a + 1, b); });
}

void check_finite(const Nfa& n, const std::string& what) {
    const size_t start = size_t(n.start);
    if (n.finish_depth[start] != kNever && n.finish_depth[start] + 1 <= kMaxStack) return;
    std::string culprits;
    int listed = 0;
    for (const auto& [rule, name] : n.rule_names) {
        if (n.finish_bytes[size_t(rule)] != kNever) continue;
        if (listed++ < 4) culprits += (culprits.empty() ? "" : ", ") + name;
    }
    if (listed > 4) culprits += fmt::format(" and {} more", listed - 4);
    if (!culprits.empty())
        LATTICE_FAIL("{}: no finite document matches: {} can never end (it leads back to itself through $ref, "
                     "anyOf/oneOf or a required property before any way out)",
                     what, culprits);
    if (n.finish_bytes[start] == kNever) LATTICE_FAIL("{}: nothing matches it (no finite output ends it)", what);
    LATTICE_FAIL("{}: its shortest document nests deeper than {} levels", what, kMaxStack - 1);
}

}  // namespace lattice::grammar_detail
