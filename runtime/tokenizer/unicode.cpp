// UTF-8 helpers and codepoint classes; see unicode.h. Lookups: an ASCII table, then binary search
// over the generated ranges.
#include "runtime/tokenizer/unicode.h"

#include <algorithm>
#include <iterator>

#include "runtime/tokenizer/unicode_ranges.h"

namespace lattice {

uint32_t utf8_next(std::string_view s, size_t& pos) {
    const auto c0 = static_cast<unsigned char>(s[pos]);
    if (c0 < 0x80) {
        ++pos;
        return c0;
    }
    const size_t n = utf8_seq_len(c0);
    if (n == 1 || pos + n > s.size()) {
        ++pos;
        return kInvalidCodepoint;
    }
    uint32_t cpt = n == 2 ? (c0 & 0x1F) : n == 3 ? (c0 & 0x0F) : (c0 & 0x07);
    for (size_t i = 1; i < n; ++i) {
        const auto c = static_cast<unsigned char>(s[pos + i]);
        if ((c & 0xC0) != 0x80) {
            ++pos;
            return kInvalidCodepoint;
        }
        cpt = (cpt << 6) | (c & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cpt < kMin[n] || cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) {
        ++pos;
        return kInvalidCodepoint;
    }
    pos += n;
    return cpt;
}

void utf8_append(std::string& out, uint32_t cpt) {
    if (cpt < 0x80) {
        out += static_cast<char>(cpt);
    } else if (cpt < 0x800) {
        out += static_cast<char>(0xC0 | (cpt >> 6));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
        out += static_cast<char>(0xE0 | (cpt >> 12));
        out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cpt >> 18));
        out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    }
}

namespace {

template <size_t N>
bool in_ranges(const unicode_tables::CodepointRange (&r)[N], uint32_t cpt) {
    auto it = std::upper_bound(std::begin(r), std::end(r), cpt,
                               [](uint32_t v, const unicode_tables::CodepointRange& x) { return v < x.first; });
    return it != std::begin(r) && cpt <= std::prev(it)->last;
}

}  // namespace

bool is_unicode_letter(uint32_t cpt) {
    if (cpt < 0x80) return (cpt | 0x20) >= 'a' && (cpt | 0x20) <= 'z';
    return cpt != kInvalidCodepoint && in_ranges(unicode_tables::kLetterRanges, cpt);
}

bool is_unicode_number(uint32_t cpt) {
    if (cpt < 0x80) return cpt >= '0' && cpt <= '9';
    return cpt != kInvalidCodepoint && in_ranges(unicode_tables::kNumberRanges, cpt);
}

bool is_unicode_whitespace(uint32_t cpt) {
    if (cpt < 0x80) return cpt == ' ' || (cpt >= 0x09 && cpt <= 0x0D);
    switch (cpt) {
        case 0x85:
        case 0xA0:
        case 0x1680:
        case 0x2028:
        case 0x2029:
        case 0x202F:
        case 0x205F:
        case 0x3000:
            return true;
        default:
            return cpt >= 0x2000 && cpt <= 0x200A;
    }
}

size_t utf8_incomplete_tail(std::string_view s) {
    // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const auto c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
        const size_t need = utf8_seq_len(c);
        return (need > 1 && need > back) ? back : 0;
    }
    return 0;
}

}  // namespace lattice
