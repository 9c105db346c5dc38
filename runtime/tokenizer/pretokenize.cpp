// Hand-coded matchers for the pre-tokenizer regexes; see pretokenize.h for the patterns.
// The text is decoded once into codepoints with their byte offsets; each matcher walks a codepoint
// range [begin, end) trying the alternatives in regex order (leftmost alternative wins, quantifiers
// greedy, backtracking written out where it matters: \s+(?!\S) and \s*[\r\n]+).
// Invalid UTF-8 bytes count as "other" (neither letter, number nor whitespace).
#include "runtime/tokenizer/pretokenize.h"

#include <cstdint>

#include "runtime/tokenizer/unicode.h"

namespace lattice {

namespace {

enum : uint8_t { kLetter = 1, kNumber = 2, kSpace = 4, kOther = 8 };

struct Cpts {
    std::vector<uint32_t> cpt;
    std::vector<uint8_t> cls;
    std::vector<size_t> off;  // byte offset of each codepoint, plus one final entry = text size
};

uint8_t classify(uint32_t c) {
    if (is_unicode_letter(c)) return kLetter;
    if (is_unicode_number(c)) return kNumber;
    if (is_unicode_whitespace(c)) return kSpace;
    return kOther;
}

uint32_t ascii_lower(uint32_t c) {
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

class Matcher {
public:
    Matcher(const Cpts& c, size_t begin, size_t end, std::string_view text, std::vector<std::string_view>& out)
        : c_(c), begin_(begin), end_(end), text_(text), out_(out), prev_(begin) {}

    uint32_t cpt(size_t i) const { return i < end_ ? c_.cpt[i] : kInvalidCodepoint; }
    uint8_t cls(size_t i) const { return i < end_ ? c_.cls[i] : 0; }
    void emit(size_t end) {
        if (end > prev_) out_.emplace_back(text_.substr(c_.off[prev_], c_.off[end] - c_.off[prev_]));
        prev_ = end;
    }

    // 's|'t|'re|'ve|'m|'ll|'d ; returns the match length or 0.
    size_t contraction(size_t pos, bool ignore_case) const {
        if (cpt(pos) != '\'') return 0;
        auto low = [&](size_t i) { return ignore_case ? ascii_lower(cpt(i)) : cpt(i); };
        const uint32_t a = low(pos + 1);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        const uint32_t b = low(pos + 2);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        return 0;
    }

    // \s+(?!\S) | \s+  (shared tail of every pattern)
    size_t whitespace(size_t pos) const {
        size_t n = 0;
        while (cls(pos + n) == kSpace) ++n;
        if (n > 1 && pos + n < end_) return n - 1;  // leave the last space to prefix the next word
        return n;
    }

    void run_gpt2() {
        for (size_t pos = begin_; pos < end_;) {
            size_t len = contraction(pos, false);
            if (len == 0) {
                const size_t q = pos + (cpt(pos) == ' ' ? 1 : 0);
                const uint8_t k = cls(q);
                if (k == kLetter || k == kNumber || k == kOther) {  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
                    size_t e = q;
                    while (cls(e) == k) ++e;
                    len = e - pos;
                } else {
                    len = whitespace(pos);
                }
            }
            if (len == 0) len = 1;
            pos += len;
            emit(pos);
        }
    }

    void run_llama3(size_t max_digits) {
        for (size_t pos = begin_; pos < end_;) {
            size_t len = contraction(pos, true);
            const uint32_t c = cpt(pos);
            const uint8_t k = cls(pos);
            if (len == 0 && c != '\r' && c != '\n' && k != kNumber) {  // [^\r\n\p{L}\p{N}]?\p{L}+
                size_t e = (k == kLetter) ? pos : pos + 1;
                if (cls(e) == kLetter) {
                    while (cls(e) == kLetter) ++e;
                    len = e - pos;
                }
            }
            if (len == 0 && k == kNumber) {  // \p{N}{1,max}
                while (len < max_digits && cls(pos + len) == kNumber) ++len;
            }
            if (len == 0) {  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
                const size_t q = pos + (c == ' ' ? 1 : 0);
                if (cls(q) == kOther) {
                    size_t e = q;
                    while (cls(e) == kOther) ++e;
                    while (cpt(e) == '\r' || cpt(e) == '\n') ++e;
                    len = e - pos;
                }
            }
            if (len == 0 && k == kSpace) {  // \s*[\r\n]+ : up to the last \r or \n of the whitespace run
                size_t last_nl = 0;
                for (size_t e = pos; cls(e) == kSpace; ++e)
                    if (cpt(e) == '\r' || cpt(e) == '\n') last_nl = e + 1;
                len = last_nl > 0 ? last_nl - pos : whitespace(pos);
            }
            if (len == 0) len = 1;
            pos += len;
            emit(pos);
        }
    }

private:
    const Cpts& c_;
    size_t begin_, end_;
    std::string_view text_;
    std::vector<std::string_view>& out_;
    size_t prev_;
};

}  // namespace

const char* pre_tokenizer_name(PreTokenizer p) {
    switch (p) {
        case PreTokenizer::kGpt2:
            return "gpt-2";
        case PreTokenizer::kLlama3:
            return "llama-bpe";
        case PreTokenizer::kQwen2:
            return "qwen2";
        case PreTokenizer::kSmolLM:
            return "smollm";
    }
    return "?";
}

void pretokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>& out) {
    Cpts c;
    c.cpt.reserve(text.size());
    c.cls.reserve(text.size());
    c.off.reserve(text.size() + 1);
    for (size_t pos = 0; pos < text.size();) {
        c.off.push_back(pos);
        const uint32_t cp = utf8_next(text, pos);
        c.cpt.push_back(cp);
        c.cls.push_back(classify(cp));
    }
    c.off.push_back(text.size());
    const size_t n = c.cpt.size();
    switch (kind) {
        case PreTokenizer::kGpt2:
            Matcher(c, 0, n, text, out).run_gpt2();
            break;
        case PreTokenizer::kLlama3:
            Matcher(c, 0, n, text, out).run_llama3(3);
            break;
        case PreTokenizer::kQwen2:
            Matcher(c, 0, n, text, out).run_llama3(1);
            break;
        case PreTokenizer::kSmolLM: {
            size_t seg = 0;
            for (size_t i = 0; i <= n; ++i) {
                if (i < n && c.cls[i] != kNumber) continue;
                if (i > seg) Matcher(c, seg, i, text, out).run_gpt2();
                if (i < n) Matcher(c, i, i + 1, text, out).run_gpt2();
                seg = i + 1;
            }
            break;
        }
    }
}

}  // namespace lattice
