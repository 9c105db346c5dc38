// UTF-8 decoding and the three codepoint classes the pre-tokenizer patterns use (\p{L}, \p{N}, \s).
// Letters and numbers come from the generated range table in unicode_ranges.h; \s is Unicode's
// White_Space property (a fixed list of 25 codepoints, written out here).
// Invalid UTF-8 never throws: each bad byte decodes as its own codepoint kInvalidCodepoint, so
// every input byte belongs to exactly one decoded unit and byte offsets always round-trip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lattice {

inline constexpr uint32_t kInvalidCodepoint = 0xFFFFFFFFu;

// Decodes one codepoint at s[pos], advances pos by its length (1 for an invalid byte).
uint32_t utf8_next(std::string_view s, size_t& pos);

// Length of the UTF-8 sequence announced by lead byte c (1 for continuation / invalid bytes).
inline size_t utf8_seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

void utf8_append(std::string& out, uint32_t cpt);

bool is_unicode_letter(uint32_t cpt);
bool is_unicode_number(uint32_t cpt);
bool is_unicode_whitespace(uint32_t cpt);

// Length of a trailing incomplete-but-so-far-valid UTF-8 sequence at the end of s (0..3): the bytes a
// streaming decoder must hold back until the rest arrives.
size_t utf8_incomplete_tail(std::string_view s);

}  // namespace lattice
