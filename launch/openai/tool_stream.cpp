// Tool calls streamed as they are written (see tool_stream.h). A small scanner over the output's JSON
// finds, without parsing what is not yet complete, where each call object starts, its "name" and the
// complete members of its arguments object.
#include "launch/openai/tool_stream.h"

namespace lattice::openai {

namespace {

using ojson = nlohmann::ordered_json;
constexpr size_t kNone = std::string_view::npos;

std::string compact(const ojson& j) {
    return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

bool ws(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

size_t skip_ws(std::string_view t, size_t i) {
    while (i < t.size() && ws(t[i])) ++i;
    return i;
}

// The end (one past the closing quote) of the string opening at i, or kNone while it is open.
size_t string_end(std::string_view t, size_t i) {
    for (size_t j = i + 1; j < t.size(); ++j) {
        if (t[j] == '\\')
            ++j;
        else if (t[j] == '"')
            return j + 1;
    }
    return kNone;
}

// The end of the JSON value starting at i, or kNone while it is incomplete (a scalar is complete once
// something that cannot continue it follows).
size_t value_end(std::string_view t, size_t i) {
    if (i >= t.size()) return kNone;
    if (t[i] == '"') return string_end(t, i);
    if (t[i] == '{' || t[i] == '[') {
        int depth = 0;
        for (size_t j = i; j < t.size(); ++j) {
            if (t[j] == '"') {
                j = string_end(t, j);
                if (j == kNone) return kNone;
                --j;
            } else if (t[j] == '{' || t[j] == '[') {
                ++depth;
            } else if ((t[j] == '}' || t[j] == ']') && --depth == 0) {
                return j + 1;
            }
        }
        return kNone;
    }
    size_t j = i;
    while (j < t.size() && !ws(t[j]) && t[j] != ',' && t[j] != '}' && t[j] != ']') ++j;
    return j < t.size() ? j : kNone;
}

struct Member {
    std::string key;
    size_t begin = kNone, end = kNone;  // the value's; end kNone: incomplete
};

struct ObjectScan {
    std::vector<Member> members;  // the last may be incomplete
    bool closed = false;
};

// The members of the object opening at t[at] == '{', as far as the text goes.
ObjectScan scan_object(std::string_view t, size_t at) {
    ObjectScan o;
    size_t i = at + 1;
    for (;;) {
        i = skip_ws(t, i);
        if (i >= t.size()) return o;
        if (t[i] == '}') {
            o.closed = true;
            return o;
        }
        if (t[i] == ',') {
            ++i;
            continue;
        }
        if (t[i] != '"') return o;  // not JSON as expected: the final parse decides
        const size_t key_end = string_end(t, i);
        if (key_end == kNone) return o;
        const ojson key = ojson::parse(t.substr(i, key_end - i), nullptr, false);
        if (!key.is_string()) return o;
        i = skip_ws(t, key_end);
        if (i >= t.size() || t[i] != ':') return o;
        Member m;
        m.key = key.get<std::string>();
        m.begin = skip_ws(t, i + 1);
        if (m.begin >= t.size()) return o;
        m.end = value_end(t, m.begin);
        o.members.push_back(m);
        if (m.end == kNone) return o;
        i = m.end;
    }
}

const Member* member(const ObjectScan& o, std::string_view key) {
    for (const Member& m : o.members)
        if (m.key == key) return &m;
    return nullptr;
}

// Where the content ends while no marker is there: before any suffix that may begin `marker`, and
// before trailing whitespace.
size_t content_before(std::string_view t, std::string_view marker) {
    size_t end = t.size();
    for (size_t k = std::min(marker.size() - 1, t.size()); k > 0; --k)
        if (t.substr(t.size() - k) == marker.substr(0, k)) {
            end = t.size() - k;
            break;
        }
    while (end > 0 && ws(t[end - 1])) --end;
    return end;
}

}  // namespace

std::vector<size_t> ToolCallStream::call_starts(std::string_view t, size_t& content_end) const {
    std::vector<size_t> starts;
    content_end = 0;
    size_t p = skip_ws(t, 0);
    if (forced_) {
        if (p < t.size() && t[p] == '{') starts.push_back(p);
        return starts;
    }
    if (format_ == ToolCallFormat::kHermes || format_ == ToolCallFormat::kMistral) {
        const std::string_view marker = format_ == ToolCallFormat::kHermes ? "<tool_call>" : "[TOOL_CALLS]";
        const size_t q = t.find(marker);
        if (q == kNone) {
            content_end = content_before(t, marker);
            return starts;
        }
        content_end = q;
        while (content_end > 0 && ws(t[content_end - 1])) --content_end;
        if (format_ == ToolCallFormat::kHermes) {
            for (size_t at = q; at != kNone; at = t.find(marker, at + marker.size())) {
                const size_t b = skip_ws(t, at + marker.size());
                if (b >= t.size() || t[b] != '{') break;
                starts.push_back(b);
            }
            return starts;
        }
        p = skip_ws(t, q + marker.size());
        if (p < t.size() && t[p] == '{') return {p};
        for (size_t i = p + 1; p < t.size() && t[p] == '[';) {  // [{...}, {...}]
            i = skip_ws(t, i);
            if (i < t.size() && t[i] == ',') {
                ++i;
                continue;
            }
            if (i >= t.size() || t[i] != '{') break;
            starts.push_back(i);
            i = value_end(t, i);
            if (i == kNone) break;
        }
        return starts;
    }
    static constexpr std::string_view kPython = "<|python_tag|>";
    const std::string_view rest = t.substr(p);
    if (rest.empty() || kPython.starts_with(rest.substr(0, kPython.size()))) {
        if (!rest.starts_with(kPython)) return starts;  // (still could be the tag)
        p = skip_ws(t, p + kPython.size());
    } else if (rest[0] != '{') {
        content_end = t.size();  // words, not a call
        return starts;
    }
    while (p < t.size() && t[p] == '{') {  // {...}; {...}
        starts.push_back(p);
        const size_t e = value_end(t, p);
        if (e == kNone) break;
        p = skip_ws(t, e);
        if (p < t.size() && t[p] == ';') p = skip_ws(t, p + 1);
    }
    return starts;
}

void ToolCallStream::stream_call(std::string_view t, size_t start, size_t k, const std::set<std::string>& names,
                                 const std::string& id, Piece& p) {
    const ObjectScan call = scan_object(t, start);
    Sent& s = sent_[k];
    if (!s.header) {
        const Member* n = member(call, "name");
        if (!n || n->end == kNone || t[n->begin] != '"') return;
        const ojson name = ojson::parse(t.substr(n->begin, n->end - n->begin), nullptr, false);
        if (!name.is_string() || (!forced_ && !names.count(name.get<std::string>()))) return;
        p.calls.push_back({{"index", int64_t(k)},
                           {"id", id},
                           {"type", "function"},
                           {"function", {{"name", name}, {"arguments", ""}}}});
        s.header = true;
    }
    const Member* a = member(call, "arguments");
    if (!a) a = member(call, "parameters");
    if (!a || s.closed || t[a->begin] != '{') return;  // arguments as a JSON string: sent whole at the end
    const ObjectScan args = scan_object(t, a->begin);
    std::string piece;
    size_t m = s.members;
    for (; m < args.members.size() && args.members[m].end != kNone; ++m) {
        const Member& x = args.members[m];
        const ojson v = ojson::parse(t.substr(x.begin, x.end - x.begin), nullptr, false);
        if (v.is_discarded()) break;
        piece += (m == 0 ? "{" : ",") + compact(ojson(x.key)) + ":" + compact(v);
    }
    s.members = m;
    if (args.closed && m == args.members.size()) {
        piece += m == 0 ? "{}" : "}";
        s.closed = true;
    }
    if (piece.empty()) return;
    s.arguments += piece;
    p.calls.push_back({{"index", int64_t(k)}, {"function", {{"arguments", piece}}}});
}

ToolCallStream::Piece ToolCallStream::push(std::string_view text, const std::set<std::string>& names,
                                           const std::string& id_prefix) {
    Piece p;
    size_t content_end = 0;
    const std::vector<size_t> starts = call_starts(text, content_end);
    if (content_end > content_.size() && text.substr(0, content_.size()) == content_) {
        p.content = std::string(text.substr(content_.size(), content_end - content_.size()));
        content_ += p.content;
    }
    for (size_t k = 0; k < starts.size() && k <= sent_.size(); ++k) {
        if (k == sent_.size()) sent_.emplace_back();
        stream_call(text, starts[k], k, names, id_prefix + std::to_string(k), p);
        if (!sent_[k].header) break;  // calls go in order
    }
    return p;
}

ToolCallStream::Piece ToolCallStream::finish(const ToolCallOutput& out, const std::string& id_prefix) {
    Piece p;
    if (!out.content.empty() && out.content.starts_with(content_)) p.content = out.content.substr(content_.size());
    for (size_t k = 0; k < out.calls.size(); ++k) {
        const Sent s = k < sent_.size() ? sent_[k] : Sent{};
        ojson call = {{"index", int64_t(k)}};
        if (!s.header) {
            call["id"] = id_prefix + std::to_string(k);
            call["type"] = "function";
            call["function"] = {{"name", out.calls[k].name}, {"arguments", out.calls[k].arguments}};
        } else if (out.calls[k].arguments.starts_with(s.arguments) && out.calls[k].arguments != s.arguments) {
            call["function"] = {{"arguments", out.calls[k].arguments.substr(s.arguments.size())}};
        } else {
            continue;
        }
        p.calls.push_back(std::move(call));
    }
    return p;
}

}  // namespace lattice::openai
