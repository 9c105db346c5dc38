// Tokenizer::encode / decode and StreamDecoder. Encoding first cuts the text at special tokens
// (longest match, leftmost), then encodes each plain fragment:
//   SentencePiece: " " -> "▁", "▁" prepended to the first fragment and to each fragment that
//   follows a special token (llama.cpp's rule; Hugging Face's Llama 2 normalizer does the same for
//   the first), merge passes over units that start at a "▁" following another character (cached;
//   the whole fragment at once if the vocab has a piece that merges could carry across such a
//   point), characters the vocab lacks become <0xNN> byte tokens (or <unk> without byte fallback;
//   without either, encode throws Error naming the bytes rather than drop them).
//   Byte-level: the family's pre-tokenizer cuts words; each word's bytes start as one symbol per
//   byte, merges by rank, results cached per word.
#include "base/error.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/unicode.h"

namespace lattice {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";
constexpr size_t kCacheMaxEntries = 1 << 16;
constexpr size_t kCacheMaxWordBytes = 64;

struct Fragment {
    std::string_view text;
    int32_t id;  // -1: plain text
};

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
    // Cut at special tokens. Candidates are filtered by first byte so plain text costs one table look-up.
    std::vector<Fragment> frags;
    bool first_byte[256] = {};
    bool any = false;
    for (const Special& s : specials_)
        if (parse_special || s.always) first_byte[uint8_t(s.text[0])] = any = true;
    size_t start = 0;
    if (any) {
        for (size_t i = 0; i < text.size();) {
            if (!first_byte[uint8_t(text[i])]) {
                ++i;
                continue;
            }
            const Special* hit = nullptr;
            for (const Special& s : specials_) {
                if ((parse_special || s.always) && text.compare(i, s.text.size(), s.text) == 0) {
                    hit = &s;
                    break;
                }
            }
            if (!hit) {
                ++i;
                continue;
            }
            if (i > start) frags.push_back({text.substr(start, i - start), -1});
            frags.push_back({{}, hit->id});
            i += hit->text.size();
            start = i;
        }
    }
    if (start < text.size()) frags.push_back({text.substr(start), -1});

    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos && spec_.bos_id >= 0) out.push_back(spec_.bos_id);
    bool prev_special = true;
    for (const Fragment& f : frags) {
        if (f.id >= 0) {
            out.push_back(f.id);
            prev_special = true;
            continue;
        }
        if (spec_.kind == TokenizerKind::kSentencePiece)
            encode_spm(f.text, spec_.add_space_prefix && prev_special, out);
        else
            encode_byte_level(f.text, out);
        prev_special = false;
    }
    return out;
}

void Tokenizer::encode_spm(std::string_view fragment, bool prefix_space, std::vector<int32_t>& out) const {
    std::string s;
    s.reserve(fragment.size() + 3 + fragment.size() / 4);
    if (prefix_space) s += kSpmSpace;
    for (char c : fragment) {
        if (c == ' ')
            s += kSpmSpace;
        else
            s += c;
    }
    if (!spm_units_) {
        spm_merge(s, out);
        return;
    }
    // No piece has "▁" after another character, so merges never cross the start of a "▁" that
    // follows a non-"▁": encode those units separately (same result) and cache them.
    const std::string_view all(s);
    size_t unit = 0;
    bool prev_space = true;
    for (size_t p = 0; p <= all.size();) {
        const bool at_end = p == all.size();
        const bool space = !at_end && all.compare(p, kSpmSpace.size(), kSpmSpace) == 0;
        if (at_end || (space && !prev_space)) {
            if (p > unit) encode_cached(all.substr(unit, p - unit), out);
            unit = p;
        }
        if (at_end) break;
        prev_space = space;
        p += space ? kSpmSpace.size() : 1;
    }
}

void Tokenizer::spm_merge(std::string_view s, std::vector<int32_t>& out) const {
    std::vector<int32_t> ids;
    std::vector<uint32_t> lens;
    ids.reserve(s.size());
    lens.reserve(s.size());
    std::string ch;
    for (size_t p = 0; p < s.size();) {
        const size_t b = p;
        utf8_next(s, p);
        int32_t id;
        if (p - b == 1 && uint8_t(s[b]) < 128) {
            id = ascii_ids_[uint8_t(s[b])];
        } else {
            ch.assign(s, b, p - b);
            auto it = piece_to_id_.find(ch);
            id = (it != piece_to_id_.end() && spec_.types[size_t(it->second)] == TokenType::kNormal) ? it->second : -1;
        }
        ids.push_back(id);
        lens.push_back(uint32_t(p - b));
    }
    merge_symbols(ids, lens);
    size_t pos = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= 0)
            out.push_back(ids[i]);
        else
            emit_fallback(s.substr(pos, lens[i]), out);
        pos += lens[i];
    }
}

// Encodes one pre-token (byte-level word or SentencePiece unit) through the bounded word cache.
void Tokenizer::encode_cached(std::string_view word, std::vector<int32_t>& out) const {
    auto encode_word = [&] {
        if (spec_.kind == TokenizerKind::kSentencePiece)
            spm_merge(word, out);
        else
            bpe_word_byte_level(word, out);
    };
    if (word.size() > kCacheMaxWordBytes) {
        encode_word();
        return;
    }
    std::string key(word);
    {
        std::lock_guard<std::mutex> lock(cache_mu_);
        auto it = cache_.find(key);
        if (it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const size_t before = out.size();
    encode_word();
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::move(key), std::vector<int32_t>(out.begin() + long(before), out.end()));
}

void Tokenizer::encode_byte_level(std::string_view fragment, std::vector<int32_t>& out) const {
    std::vector<std::string_view> words;
    pretokenize(spec_.pre, fragment, words);
    for (std::string_view w : words) encode_cached(w, out);
}

void Tokenizer::bpe_word_byte_level(std::string_view word, std::vector<int32_t>& out) const {
    if (spec_.ignore_merges) {
        std::string mapped;
        for (char c : word) utf8_append(mapped, gpt2_byte_to_codepoint(uint8_t(c)));
        auto it = piece_to_id_.find(mapped);
        if (it != piece_to_id_.end()) {
            out.push_back(it->second);
            return;
        }
    }
    std::vector<int32_t> ids(word.size());
    std::vector<uint32_t> lens(word.size(), 1);
    for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_ids_[uint8_t(word[i])];
    merge_symbols(ids, lens);
    size_t pos = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= 0)
            out.push_back(ids[i]);
        else if (spec_.unk_id >= 0)
            out.push_back(spec_.unk_id);
        else
            refuse_unencodable(word.substr(pos, lens[i]));
        pos += lens[i];
    }
}

// Text one token contributes to decoded output (before SentencePiece's leading-space strip).
static std::string_view decode_piece(const Tokenizer& t, int32_t id, bool render_special) {
    const TokenType type = t.token_type(id);
    if (type == TokenType::kControl || type == TokenType::kUnknown) {
        if (!render_special) return {};
        return t.token_text(id);
    }
    return t.token_bytes(id);
}

static std::string_view strip_dummy_prefix(const Tokenizer& t, std::string_view piece, bool& first) {
    if (piece.empty() || !first) return piece;
    first = false;
    const bool strip = t.kind() == TokenizerKind::kSentencePiece && t.spm_space_prefix();
    if (strip && piece[0] == ' ') piece.remove_prefix(1);
    return piece;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
    std::string out;
    bool first = true;
    for (int32_t id : ids) out += strip_dummy_prefix(*this, decode_piece(*this, id, render_special), first);
    return out;
}

std::string StreamDecoder::push(int32_t id) {
    pending_ += strip_dummy_prefix(tok_, decode_piece(tok_, id, render_special_), first_);
    const size_t hold = utf8_incomplete_tail(pending_);
    std::string ready = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return ready;
}

std::string StreamDecoder::finish() {
    std::string rest = std::move(pending_);
    pending_.clear();
    return rest;
}

void StreamDecoder::reset() {
    pending_.clear();
    first_ = true;
}

}  // namespace lattice
