// How a request's body is framed, the rule lattice serve applies before reading it (RFC 9112 6.3):
// a Transfer-Encoding whose last coding is not `chunked` cannot frame a request, and one beside a
// Content-Length is how requests get smuggled past a proxy; both are a 400 and a close. Header-only
// and free of Asio so that tests/fuzz/fuzz_http_framing.cpp runs it over Beast's parser directly.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace lattice::serve {

// The refusal's message, or nothing when the framing is acceptable. `te`: the Transfer-Encoding
// field's value as sent (absent: std::nullopt); `parser_chunked`: whether the parser that reads the
// body (Beast's) frames it as chunked. Both readings must agree: a value whose last element reads as
// chunked to us but not to the parser (obs-folded lines, elements that are not tokens) is refused too,
// or a proxy and this server would split the stream differently (found by fuzz_http_framing).
inline std::optional<std::string> framing_refusal(std::optional<std::string_view> te, bool has_content_length,
                                                  bool parser_chunked) {
    if (!te) {
        if (!parser_chunked) return std::nullopt;
        return std::string("a chunked body without a Transfer-Encoding field");
    }
    const size_t comma = te->find_last_of(',');
    std::string_view last = te->substr(comma == std::string_view::npos ? 0 : comma + 1);
    while (!last.empty() && (last.front() == ' ' || last.front() == '\t')) last.remove_prefix(1);
    while (!last.empty() && (last.back() == ' ' || last.back() == '\t')) last.remove_suffix(1);
    bool chunked = last.size() == 7;
    for (size_t i = 0; chunked && i < 7; ++i) chunked = (last[i] | 0x20) == "chunked"[i];
    for (char c : *te)  // a list of tokens: no control bytes, no obs-fold
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t') chunked = false;
    if (chunked && !has_content_length && parser_chunked) return std::nullopt;
    return "Transfer-Encoding \"" + std::string(*te) + "\": only a final chunked coding, without Content-Length";
}

}  // namespace lattice::serve
