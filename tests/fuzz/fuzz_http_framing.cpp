// libFuzzer target: HTTP/1.1 request framing as lattice serve reads it: Beast's request parser (the
// server's header and body limits) over a byte stream of pipelined requests, our Transfer-Encoding
// rule (launch/server/http_framing.h) applied once each header is parsed, as the server does before
// reading a body. Checked on every input: an accepted request with a Transfer-Encoding is framed as
// chunked by Beast, has no Content-Length and ends in exactly "chunked" (our verdict and the parser's
// framing never disagree, the gap request smuggling lives in: an obs-folded Transfer-Encoding that
// ended in "chunked" to us but not to Beast was the first finding); a refused one ends the stream (nothing after it is
// parsed, as the server closes the connection); no exception, no sanitizer report. Seeds (seeds_http/): the
// Transfer-Encoding values a smuggling attempt sends (xchunked, identity, "chunked, identity", chunked beside a
// Content-Length, each followed by a pipelined GET) and well-framed requests.
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "launch/server/http_framing.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view in(reinterpret_cast<const char*>(data), size);
    for (int message = 0; message < 8 && !in.empty(); ++message) {
        http::request_parser<http::string_body> p;
        p.header_limit(16 << 10);
        p.body_limit(1 << 20);
        p.eager(false);
        boost::beast::error_code ec;
        // The header first, as the server's async_read_header.
        while (!in.empty() && !p.is_header_done()) {
            const size_t used = p.put(boost::asio::buffer(in.data(), in.size()), ec);
            in.remove_prefix(used);
            if (ec == http::error::need_more) return 0;  // the stream ends mid-header
            if (ec) return 0;                            // a 400 and a close
            if (used == 0) return 0;
        }
        if (!p.is_header_done()) return 0;
        const auto& req = p.get();
        std::optional<std::string_view> te;
        if (req.find(http::field::transfer_encoding) != req.end()) {
            const auto v = req[http::field::transfer_encoding];
            te = std::string_view(v.data(), v.size());
        }
        const bool has_length = req.find(http::field::content_length) != req.end();
        if (lattice::serve::framing_refusal(te, has_length, p.chunked())) return 0;  // refused: the connection closes
        if (te && (!p.chunked() || has_length)) std::abort();                        // accepted but framed otherwise
        if (!te && p.chunked()) std::abort();
        if (te) {  // accepted: the last element is exactly "chunked" (any case), and it is a token list
            std::string_view v = *te;
            const size_t comma = v.find_last_of(',');
            v = v.substr(comma == std::string_view::npos ? 0 : comma + 1);
            while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
            while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
            bool chunked = v.size() == 7;
            for (size_t i = 0; chunked && i < 7; ++i) chunked = (v[i] | 0x20) == "chunked"[i];
            if (!chunked) std::abort();
        }
        p.eager(true);
        while (!in.empty() && !p.is_done()) {
            const size_t used = p.put(boost::asio::buffer(in.data(), in.size()), ec);
            in.remove_prefix(used);
            if (ec) return 0;
            if (used == 0) return 0;
        }
        if (!p.is_done()) return 0;
        if (p.get().body().size() > (1u << 20)) std::abort();
    }
    return 0;
}
