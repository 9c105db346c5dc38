// Tool calls of a streamed chat sent as they are written, as vLLM's tool parsers stream them: a call's
// first delta carries its index, id, type and function name (once the name is complete and names an
// offered tool), later deltas only pieces of its "arguments" text; content before the calls streams as
// content. For each format of runtime/tokenizer/tool_calls.h: kHermes (<tool_call>{...}</tool_call>,
// any number), kMistral ([TOOL_CALLS][{...}, ...]), kJson (the output one object, or several joined by
// ';', after an optional <|python_tag|>), and a forced call (the output is the call object).
// Arguments stream member by member: each complete top-level member of the arguments object is sent as
// its compact JSON ('{"city":"Rome"', then ',"days":3', then '}'), so the pieces concatenate to exactly
// the arguments text the non-streamed response carries (the compact object, keys in the model's order).
// Content is held back while it could still be the start of a call marker, and its trailing whitespace
// until more text follows (a response with calls trims its content). At the end, finish() sends what the
// final parse has beyond what was streamed (a call whose name came late, the last argument pieces, the
// rest of the content), so a client that concatenates the deltas gets the non-streamed message.
// Invariant: only text that the final parse must agree with is sent early (a call header only for an
// offered name; argument members only once complete).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/tool_calls.h"

namespace lattice::openai {

class ToolCallStream {
public:
    ToolCallStream() = default;
    ToolCallStream(ToolCallFormat format, bool forced) : format_(format), forced_(forced) {}

    // What to send now, given the whole output so far.
    struct Piece {
        std::string content;                                             // "" : none
        nlohmann::ordered_json calls = nlohmann::ordered_json::array();  // delta tool_calls entries
        bool empty() const { return content.empty() && calls.empty(); }
    };
    // Call k's id is id_prefix + k (the non-streamed response's).
    Piece push(std::string_view text, const std::set<std::string>& names, const std::string& id_prefix);
    // The rest, against the final parse of the whole output.
    Piece finish(const ToolCallOutput& final_out, const std::string& id_prefix);

private:
    struct Sent {
        bool header = false;
        size_t members = 0;     // argument members sent
        std::string arguments;  // what was sent of the arguments
        bool closed = false;
    };
    std::vector<size_t> call_starts(std::string_view text, size_t& content_end) const;
    void stream_call(std::string_view text, size_t start, size_t k, const std::set<std::string>& names,
                     const std::string& id, Piece& p);

    ToolCallFormat format_ = ToolCallFormat::kJson;
    bool forced_ = false;
    std::string content_;     // content sent
    std::vector<Sent> sent_;  // by call
};

}  // namespace lattice::openai
