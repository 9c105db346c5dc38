// Bounds for untrusted JSON, checked before it is parsed: a DOM parser turns each nested bracket or
// small value into a heap node of tens of bytes, so 80 MB of "[[[[..." or of tiny entries costs
// gigabytes before any semantic check runs. check_json_limits() walks the text once (strings and
// escapes respected), stops at the first excess and throws Error naming the
// file, the limit and the byte offset. The text is not validated here; the parser does that after.
#pragma once

#include "base/error.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace lattice {

struct JsonLimits {
    int max_depth = 64;                       // nesting of arrays and objects
    int64_t max_top_members = -1;             // entries of the top-level object or array (-1: no limit)
    int64_t max_elements = int64_t(1) << 24;  // containers plus separators: bounds the parser's nodes
    const char* member_name = "entries";      // what the top-level entries are, for the message
};

inline void check_json_limits(std::string_view text, const std::string& name, const JsonLimits& lim) {
    int depth = 0;
    int64_t top_commas = 0, elements = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            LATTICE_CHECK(++depth <= lim.max_depth, "{}: JSON nested deeper than {} levels (at byte {})", name,
                          lim.max_depth, i);
            LATTICE_CHECK(++elements <= lim.max_elements, "{}: JSON has more than {} elements (at byte {})", name,
                          lim.max_elements, i);
        } else if (c == ']' || c == '}') {
            if (depth > 0) --depth;
        } else if (c == ',') {
            LATTICE_CHECK(++elements <= lim.max_elements, "{}: JSON has more than {} elements (at byte {})", name,
                          lim.max_elements, i);
            if (depth == 1 && lim.max_top_members >= 0)
                LATTICE_CHECK(++top_commas < lim.max_top_members, "{}: more than {} {}, the limit (at byte {})", name,
                              lim.max_top_members, lim.member_name, i);
        }
    }
}

}  // namespace lattice
