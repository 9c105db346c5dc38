// libFuzzer target for structured-output compilation (runtime/engine/grammar.h): the first byte picks
// the front end (JSON schema, regex, choice list split at '\n'), the rest is its text. A grammar that
// compiles is then walked: a few masks on a small byte vocabulary, a token taken from each, and the
// finishing APIs (distance, min_remaining_tokens, fill_mask_within). Invariants checked:
// lattice::Error is the only exception; a compiled grammar has some finite output (compile refuses
// the others), so distance() and min_remaining_tokens() are finite at the start; every mask is
// non-empty and each token it allows is accepted; fill_mask_within's mask is a subset of fill_mask's.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/engine/grammar.h"

namespace {

const std::shared_ptr<const lattice::TokenVocab>& vocab() {
    static const std::shared_ptr<const lattice::TokenVocab> v = [] {
        std::vector<std::string> t;
        for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
        for (const char* s : {"{\"", "\":", "\",\"", "\"}", "true", "null", "12", "ab", "\xC3\xA9", "[1", "],"})
            t.push_back(s);
        const int32_t end = int32_t(t.size());
        t.push_back("");
        return std::make_shared<const lattice::TokenVocab>(t, std::vector<int32_t>{end});
    }();
    return v;
}

bool bit(const std::vector<uint32_t>& w, int32_t id) {
    return (w[size_t(id / 32)] >> (id % 32)) & 1u;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size > 16 * 1024) return 0;
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    lattice::GrammarSpec spec;
    switch (data[0] % 3) {
        case 0:
            spec.kind = lattice::GrammarSpec::Kind::kJsonSchema;
            spec.source = text;
            break;
        case 1:
            spec.kind = lattice::GrammarSpec::Kind::kRegex;
            spec.source = text;
            break;
        default:
            spec.kind = lattice::GrammarSpec::Kind::kChoice;
            for (size_t at = 0; at <= text.size();) {
                const size_t nl = text.find('\n', at);
                spec.choices.push_back(text.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
                if (nl == std::string::npos) break;
                at = nl + 1;
            }
    }
    std::shared_ptr<const lattice::Grammar> g;
    try {
        g = lattice::Grammar::compile(spec);
    } catch (const lattice::Error&) {
        return 0;
    }
    const auto& v = vocab();
    lattice::GrammarMatcher m(g, v);
    if (m.distance() == INT32_MAX || m.min_remaining_tokens() == INT32_MAX) std::abort();
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32)), within(w.size());
    for (int step = 0; step < 24 && !m.finished(); ++step) {
        m.fill_mask(w);
        m.fill_mask_within(within, 24 - step);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < v->size(); ++id) {
            if (bit(within, id) && !bit(w, id)) std::abort();
            if (bit(w, id) && !v->is_end(id)) allowed.push_back(id);
        }
        if (allowed.empty()) {
            if (!m.complete()) std::abort();  // nothing allowed and not complete: a dead end
            break;
        }
        const int32_t id = allowed[size_t(data[size_t(step) % size]) % allowed.size()];
        if (!m.accept(id)) std::abort();
    }
    return 0;
}
