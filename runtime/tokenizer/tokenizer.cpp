// Tokenizer tables, encode and decode; see tokenizer.h for the model. The merge loop is the one
// SentencePiece and llama.cpp use: symbols in a doubly linked list, candidate pairs in a priority
// queue ordered by (score desc, position asc); a popped candidate is applied only if both symbols
// still hold the ids it was made from and are still adjacent, so stale entries cost one pop each.
// That makes a word of n symbols O(n log n) instead of the O(n^2) of rescanning for the best pair.
#include "runtime/tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>

#include "base/error.h"
#include "base/log.h"
#include "runtime/tokenizer/jinja.h"
#include "runtime/tokenizer/unicode.h"

namespace lattice {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"
constexpr size_t kMaxVocab = size_t(1) << 24;

uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// "<0xNN>" -> NN, else -1.
int parse_byte_piece(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, from.size(), from) == 0) {
            out += to;
            i += from.size();
        } else {
            out += s[i++];
        }
    }
    return out;
}

}  // namespace

uint32_t gpt2_byte_to_codepoint(uint8_t b) {
    // Printable Latin-1 bytes map to themselves; the other 68 bytes to U+0100.. in byte order.
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
    uint32_t n = 0;
    for (uint32_t x = 0; x < b; ++x)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) ++n;
    return 0x100 + n;
}

int gpt2_codepoint_to_byte(uint32_t cpt) {
    static const std::vector<int> table = [] {
        std::vector<int> t(0x144, -1);
        for (int b = 0; b < 256; ++b) t[gpt2_byte_to_codepoint(uint8_t(b))] = b;
        return t;
    }();
    return cpt < table.size() ? table[cpt] : -1;
}

Tokenizer::Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {
    build_tables();
}
Tokenizer::~Tokenizer() = default;

void Tokenizer::build_tables() {
    const std::string& src = spec_.source;
    const size_t n = tokens_.size();
    LATTICE_CHECK(n > 0 && n <= kMaxVocab, "tokenizer {}: vocab size {} out of range (1..{})", src, n, kMaxVocab);
    if (spec_.types.empty()) spec_.types.assign(n, TokenType::kNormal);
    LATTICE_CHECK(spec_.types.size() == n, "tokenizer {}: {} token types for {} tokens", src, spec_.types.size(), n);
    LATTICE_CHECK(spec_.scores.empty() || spec_.scores.size() == n, "tokenizer {}: {} scores for {} tokens", src,
                  spec_.scores.size(), n);
    for (int32_t* id : {&spec_.bos_id, &spec_.eos_id, &spec_.unk_id, &spec_.pad_id})
        LATTICE_CHECK(*id >= -1 && *id < int32_t(n), "tokenizer {}: special token id {} outside vocab of {}", src, *id,
                      n);
    std::erase_if(spec_.eog_ids, [&](int32_t id) { return id < 0 || id >= int32_t(n); });
    if (spec_.eos_id >= 0 && std::find(spec_.eog_ids.begin(), spec_.eog_ids.end(), spec_.eos_id) == spec_.eog_ids.end())
        spec_.eog_ids.push_back(spec_.eos_id);

    piece_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) piece_to_id_.emplace(tokens_[i], int32_t(i));
    std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
    std::fill(std::begin(ascii_ids_), std::end(ascii_ids_), -1);

    const bool spm = spec_.kind == TokenizerKind::kSentencePiece;
    bytes_.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::string& t = tokens_[i];
        const TokenType type = spec_.types[i];
        if (type == TokenType::kControl || type == TokenType::kUnknown || type == TokenType::kUnused) continue;
        if (type == TokenType::kUserDefined) {
            bytes_[i] = spm ? replace_all(t, kSpmSpace, " ") : t;
        } else if (spm) {
            const int b = type == TokenType::kByte ? parse_byte_piece(t) : -1;
            if (b >= 0) {
                bytes_[i] = std::string(1, char(b));
                if (byte_ids_[b] < 0) byte_ids_[b] = int32_t(i);
            } else {
                bytes_[i] = replace_all(t, kSpmSpace, " ");
            }
        } else {
            std::string out;
            for (size_t p = 0; p < t.size();) {
                const size_t start = p;
                const int b = gpt2_codepoint_to_byte(utf8_next(t, p));
                if (b >= 0)
                    out += char(b);
                else
                    out.append(t, start, p - start);  // not a mapped char: keep its UTF-8
            }
            bytes_[i] = std::move(out);
        }
    }
    if (!spm) {
        for (int b = 0; b < 256; ++b) {
            std::string ch;
            utf8_append(ch, gpt2_byte_to_codepoint(uint8_t(b)));
            // Some vocabs (SmolLM2) lack a few control bytes; such bytes encode as <unk>, and text holding
            // one is refused when there is none (Hugging Face and llama.cpp drop it silently).
            byte_ids_[b] = token_id(ch);
        }
    }

    // Special tokens, longest first so "<|im_start|>" wins over a shorter prefix.
    for (size_t i = 0; i < n; ++i) {
        const TokenType type = spec_.types[i];
        if ((type == TokenType::kControl || type == TokenType::kUserDefined) && !tokens_[i].empty())
            specials_.push_back({tokens_[i], int32_t(i), type == TokenType::kUserDefined});
    }
    std::stable_sort(specials_.begin(), specials_.end(),
                     [](const Special& a, const Special& b) { return a.text.size() > b.text.size(); });

    // Merge table keyed by adjacent id pair.
    auto normal = [&](int32_t id) { return id >= 0 && spec_.types[size_t(id)] == TokenType::kNormal; };
    if (!spec_.merges.empty()) {
        merges_.reserve(spec_.merges.size());
        std::string joined;
        for (size_t r = 0; r < spec_.merges.size(); ++r) {
            const auto& [a, b] = spec_.merges[r];
            joined.assign(a).append(b);
            const int32_t ia = token_id(a), ib = token_id(b), iab = token_id(joined);
            if (ia < 0 || ib < 0 || iab < 0) continue;  // a merge into a token the vocab lacks can never apply
            merges_.emplace(pair_key(ia, ib), Merge{-float(r), iab});
        }
    } else if (spm) {
        LATTICE_CHECK(spec_.scores.size() == n, "tokenizer {}: SentencePiece vocab needs scores or merges", src);
        for (size_t i = 0; i < n; ++i) {
            if (!normal(int32_t(i))) continue;
            const std::string& t = tokens_[i];
            for (size_t p = 0; p < t.size();) {
                utf8_next(t, p);
                if (p >= t.size()) break;
                const int32_t ia = token_id(std::string_view(t).substr(0, p));
                const int32_t ib = token_id(std::string_view(t).substr(p));
                if (normal(ia) && normal(ib)) merges_.emplace(pair_key(ia, ib), Merge{spec_.scores[i], int32_t(i)});
            }
        }
    }

    if (spm) {
        for (int c = 0; c < 128; ++c) {
            const int32_t id = token_id(std::string(1, char(c)));
            ascii_ids_[c] = normal(id) ? id : -1;
        }
        spm_units_ = true;
        for (size_t i = 0; i < n && spm_units_; ++i) {
            const std::string& t = tokens_[i];
            if (!normal(int32_t(i))) continue;
            for (size_t at = t.find(kSpmSpace, 1); at != std::string::npos; at = t.find(kSpmSpace, at + 1))
                if (at < kSpmSpace.size() || t.compare(at - kSpmSpace.size(), kSpmSpace.size(), kSpmSpace) != 0)
                    spm_units_ = false;
        }
    }

    chat_kind_ = detect_chat_template(spec_.chat_template);
    if (chat_kind_ == ChatTemplateKind::kChatML) default_system_ = chatml_default_system(spec_.chat_template);
    if (!spec_.chat_template.empty()) {
        try {
            jinja_ = std::make_shared<const jinja::Template>(spec_.chat_template, spec_.source);
            if (chat_kind_ == ChatTemplateKind::kNone) chat_kind_ = ChatTemplateKind::kJinja;
        } catch (const Error& e) {
            // A template beyond our Jinja subset: the model still loads; chat uses the family format.
            LOG_WARN("{}: chat template not usable ({}); {}", spec_.source, e.message(),
                     chat_kind_ == ChatTemplateKind::kNone ? "no chat format"
                                                           : std::string("using the built-in ") +
                                                                 chat_template_kind_name(chat_kind_) + " format");
        }
    }
}

const std::string& Tokenizer::token_text(int32_t id) const {
    static const std::string kEmpty;
    return (id >= 0 && id < vocab_size()) ? tokens_[size_t(id)] : kEmpty;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
    static const std::string kEmpty;
    return (id >= 0 && id < vocab_size()) ? bytes_[size_t(id)] : kEmpty;
}

int32_t Tokenizer::token_id(std::string_view piece) const {
    auto it = piece_to_id_.find(std::string(piece));
    return it == piece_to_id_.end() ? -1 : it->second;
}

TokenType Tokenizer::token_type(int32_t id) const {
    return (id >= 0 && id < vocab_size()) ? spec_.types[size_t(id)] : TokenType::kUnused;
}

bool Tokenizer::is_eog(int32_t id) const {
    return std::find(spec_.eog_ids.begin(), spec_.eog_ids.end(), id) != spec_.eog_ids.end();
}

std::string Tokenizer::describe() const {
    return fmt::format("{} ({}, {} tokens{}{}, bos {}, eos {}, chat template {})", spec_.source,
                       spec_.kind == TokenizerKind::kSentencePiece ? "sentencepiece bpe" : "byte-level bpe",
                       tokens_.size(), spec_.kind == TokenizerKind::kByteLevel ? ", pre " : "",
                       spec_.kind == TokenizerKind::kByteLevel ? pre_tokenizer_name(spec_.pre) : "", spec_.bos_id,
                       spec_.eos_id, chat_template_kind_name(chat_kind_));
}

ChatTemplate Tokenizer::chat_template() const {
    if (jinja_) {
        auto text = [&](int32_t id) { return id >= 0 ? token_text(id) : std::string(); };
        return ChatTemplate(jinja_, chat_kind_, text(spec_.bos_id), text(spec_.eos_id));
    }
    const bool llama2 = chat_kind_ == ChatTemplateKind::kLlama2, llama3 = chat_kind_ == ChatTemplateKind::kLlama3;
    std::string bos = (llama2 || llama3) ? token_text(spec_.bos_id) : std::string();
    std::string eos = llama2 ? token_text(spec_.eos_id) : std::string();
    return ChatTemplate(chat_kind_, bos, eos, default_system_);
}

void Tokenizer::merge_symbols(std::vector<int32_t>& ids, std::vector<uint32_t>& lens) const {
    const int32_t n = int32_t(ids.size());
    if (n < 2 || merges_.empty()) return;
    struct Cand {
        float score;
        int32_t left, right, left_id, right_id, merged;
    };
    auto worse = [](const Cand& a, const Cand& b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
    std::vector<int32_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        prev[size_t(i)] = i - 1;
        next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    }
    auto try_pair = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const int32_t a = ids[size_t(l)], b = ids[size_t(r)];
        if (a < 0 || b < 0) return;
        auto it = merges_.find(pair_key(a, b));
        if (it != merges_.end()) queue.push({it->second.score, l, r, a, b, it->second.id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) try_pair(i, i + 1);
    while (!queue.empty()) {
        const Cand c = queue.top();
        queue.pop();
        const size_t l = size_t(c.left), r = size_t(c.right);
        if (lens[l] == 0 || lens[r] == 0 || next[l] != c.right || ids[l] != c.left_id || ids[r] != c.right_id) continue;
        ids[l] = c.merged;
        lens[l] += lens[r];
        lens[r] = 0;
        next[l] = next[r];
        if (next[r] >= 0) prev[size_t(next[r])] = c.left;
        try_pair(prev[l], c.left);
        try_pair(c.left, next[l]);
    }
    size_t w = 0;
    for (int32_t i = 0; i >= 0; i = next[size_t(i)]) {
        ids[w] = ids[size_t(i)];
        lens[w] = lens[size_t(i)];
        ++w;
    }
    ids.resize(w);
    lens.resize(w);
}

void Tokenizer::emit_fallback(std::string_view bytes, std::vector<int32_t>& out) const {
    bool all = true;
    for (char c : bytes) all = all && byte_ids_[uint8_t(c)] >= 0;
    if (all) {
        for (char c : bytes) out.push_back(byte_ids_[uint8_t(c)]);
    } else if (spec_.unk_id >= 0) {
        out.push_back(spec_.unk_id);
    } else {
        refuse_unencodable(bytes);
    }
}

void Tokenizer::refuse_unencodable(std::string_view bytes) const {
    std::string hex;
    for (char c : bytes) hex += fmt::format("{}{:02x}", hex.empty() ? "" : " ", uint8_t(c));
    LATTICE_FAIL(
        "tokenizer {}: the text holds a character (bytes {}) that the vocab cannot encode: no token, no byte "
        "fallback and no unknown token for it; refusing to drop it silently",
        spec_.source, hex);
}

}  // namespace lattice
