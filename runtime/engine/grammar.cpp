// Grammar::compile (dispatch to the front ends), GrammarSpec::key, and the vocabulary index the mask
// walks: the byte trie of every token, the trie of the "non-plain" tokens, and the plain-token
// bitsets by character count. A plain token is a valid UTF-8 prefix made only of characters a JSON
// string takes unescaped (U+0020.. except '"' and '\'), possibly ending inside a character; its
// character count is its number of lead bytes. See grammar.h for how the mask uses them.
#include "runtime/engine/grammar.h"

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/error.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

// Characters of `s` if it is a plain JSON-string run (see the header comment), else -1.
int plain_chars(const std::string& s) {
    int chars = 0;
    size_t i = 0;
    while (i < s.size()) {
        const uint8_t b = uint8_t(s[i]);
        int n = 0;
        uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte
        if (b < 0x80) {
            if (b < 0x20 || b == '"' || b == '\\') return -1;
            n = 1;
        } else if (b >= 0xC2 && b <= 0xDF) {
            n = 2;
        } else if (b >= 0xE0 && b <= 0xEF) {
            n = 3;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            n = 4;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            return -1;
        }
        ++chars;
        for (int k = 1; k < n; ++k) {
            if (i + size_t(k) >= s.size()) return chars;  // ends inside the character: a valid prefix
            const uint8_t c = uint8_t(s[i + size_t(k)]);
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -1;
        }
        i += size_t(n);
    }
    return chars;
}

const char* kind_name(GrammarSpec::Kind k) {
    switch (k) {
        case GrammarSpec::Kind::kNone:
            return "none";
        case GrammarSpec::Kind::kJsonObject:
            return "json_object";
        case GrammarSpec::Kind::kJsonSchema:
            return "json_schema";
        case GrammarSpec::Kind::kRegex:
            return "regex";
        case GrammarSpec::Kind::kChoice:
            return "choice";
    }
    return "?";
}

}  // namespace

std::string GrammarSpec::key() const {
    std::string k = kind_name(kind);
    k += ':';
    if (kind == Kind::kJsonSchema) {
        // Same schema, different spacing: same key. Key order is kept (properties are emitted in it).
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(source, nullptr, false);
        k += j.is_discarded() ? source : j.dump();
    } else if (kind == Kind::kRegex) {
        k += source;
    } else if (kind == Kind::kChoice) {
        k += nlohmann::json(choices).dump();
    }
    return k;
}

std::shared_ptr<const Grammar> Grammar::compile(const GrammarSpec& spec) {
    grammar_detail::Nfa nfa;
    const char* what = "";
    switch (spec.kind) {
        case GrammarSpec::Kind::kJsonObject:
            nfa = compile_json_object();
            what = "json_object";
            break;
        case GrammarSpec::Kind::kJsonSchema:
            nfa = compile_json_schema(spec.source);
            what = "json_schema";
            break;
        case GrammarSpec::Kind::kRegex:
            nfa = compile_regex(spec.source);
            what = "guided_regex";
            break;
        case GrammarSpec::Kind::kChoice:
            nfa = compile_choice(spec.choices);
            what = "choice";
            break;
        case GrammarSpec::Kind::kNone:
            LATTICE_FAIL("structured output: Grammar::compile called without a grammar (kind none)");
    }
    // A grammar that no finite output completes would answer "" as if it were a whole document.
    grammar_detail::analyze(nfa);
    grammar_detail::check_finite(nfa, what);
    return std::make_shared<const Grammar>(std::move(nfa));
}

Grammar::Grammar(grammar_detail::Nfa nfa) : nfa_(std::move(nfa)) {
    if (nfa_.finish_bytes.size() != nfa_.flags.size()) grammar_detail::analyze(nfa_);
}

namespace grammar_detail {

void Trie::build(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids) {
    std::vector<int32_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return bytes[size_t(a)] < bytes[size_t(b)]; });
    byte.assign(1, 0);
    depth.assign(1, 0);
    end.assign(1, 0);
    std::vector<uint32_t> path{0};
    std::vector<std::pair<uint32_t, int32_t>> owned;  // (node, token), nodes nondecreasing
    const std::string* prev = nullptr;
    for (int32_t id : sorted) {
        const std::string& s = bytes[size_t(id)];
        size_t lcp = 0;
        if (prev)
            while (lcp < prev->size() && lcp < s.size() && (*prev)[lcp] == s[lcp]) ++lcp;
        for (; path.size() > lcp + 1; path.pop_back()) end[path.back()] = uint32_t(byte.size());
        for (size_t j = lcp; j < s.size(); ++j) {
            LATTICE_CHECK(j + 1 < 65536, "structured output: token {} is longer than 65535 bytes", id);
            path.push_back(uint32_t(byte.size()));
            byte.push_back(uint8_t(s[j]));
            depth.push_back(uint16_t(j + 1));
            end.push_back(0);
            max_depth = std::max(max_depth, int(j + 1));
        }
        owned.emplace_back(path.back(), id);
        prev = &s;
    }
    for (; !path.empty(); path.pop_back()) end[path.back()] = uint32_t(byte.size());
    tok_off.assign(byte.size() + 1, 0);
    for (auto [node, id] : owned) ++tok_off[node + 1];
    std::partial_sum(tok_off.begin(), tok_off.end(), tok_off.begin());
    toks.resize(owned.size());
    for (size_t i = 0; i < owned.size(); ++i) toks[i] = owned[i].second;  // already grouped by node in order
}

bool Configs::contains(std::span<const int32_t> c) const {
    const int32_t t = c.back();
    for (int32_t i = 0; i < size(); ++i) {
        if (top(i) != t) continue;
        const auto x = at(i);
        if (x.size() == c.size() && std::equal(x.begin(), x.end(), c.begin())) return true;
    }
    return false;
}

}  // namespace grammar_detail

TokenVocab::TokenVocab(std::vector<std::string> bytes, std::vector<int32_t> end_ids)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)) {
    using namespace grammar_detail;
    static std::atomic<uint32_t> serials{0};
    serial_ = ++serials;
    words_ = int32_t((bytes_.size() + 31) / 32);
    is_end_.assign(bytes_.size(), 0);
    for (int32_t id : end_ids_) {
        LATTICE_CHECK(id >= 0 && size_t(id) < bytes_.size(), "TokenVocab: end id {} is outside the vocabulary of {}",
                      id, bytes_.size());
        is_end_[size_t(id)] = 1;
        bytes_[size_t(id)].clear();
    }
    std::vector<int32_t> all, nonplain;
    plain_words_.assign(size_t(kPlainMaxChars + 1) * size_t(words_), 0);
    for (int32_t id = 0; id < int32_t(bytes_.size()); ++id) {
        const std::string& s = bytes_[size_t(id)];
        if (s.empty()) continue;
        all.push_back(id);
        const int c = plain_chars(s);
        if (c < 0 || c > kPlainMaxChars) {
            nonplain.push_back(id);
            continue;
        }
        for (int k = c; k <= kPlainMaxChars; ++k)  // cumulative: a token of c chars is in every set k >= c
            plain_words_[size_t(k) * size_t(words_) + size_t(id / 32)] |= 1u << (id % 32);
    }
    all_.build(bytes_, all);
    nonplain_.build(bytes_, nonplain);
    std::vector<uint8_t> single(256, 0);
    for (const std::string& b : bytes_)
        if (b.size() == 1) single[uint8_t(b[0])] = 1;
    all_bytes_ = std::all_of(single.begin(), single.end(), [](uint8_t x) { return x != 0; });
}

std::span<const uint32_t> TokenVocab::plain_upto(int k) const {
    k = std::clamp(k, 0, grammar_detail::kPlainMaxChars);
    return {plain_words_.data() + size_t(k) * size_t(words_), size_t(words_)};
}

std::shared_ptr<const TokenVocab> make_token_vocab(const Tokenizer& tok, int32_t logits_width) {
    std::vector<std::string> bytes(size_t(std::max(tok.vocab_size(), logits_width)));
    for (int32_t id = 0; id < tok.vocab_size(); ++id) bytes[size_t(id)] = tok.token_bytes(id);
    std::vector<int32_t> ends = tok.eog_ids();
    if (tok.eos_id() >= 0 && std::find(ends.begin(), ends.end(), tok.eos_id()) == ends.end())
        ends.push_back(tok.eos_id());
    LATTICE_CHECK(!ends.empty(), "structured output: the tokenizer {} has no end-of-generation token", tok.source());
    return std::make_shared<const TokenVocab>(std::move(bytes), std::move(ends));
}

}  // namespace lattice
