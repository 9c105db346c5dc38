// JSON schema -> Nfa: the subset OpenAI structured outputs and pydantic's model_json_schema send.
//
// Supported: type (a name or a list), properties (emitted in schema order; required ones always,
// optional ones may be skipped), required, additionalProperties (false, or absent next to
// properties: no other keys, a subset of what an absent keyword allows, which keeps output to the
// declared keys; absent on an object without properties: any keys; true or a schema:
// further keys after the declared ones, never equal to a declared name: along a declared name's
// prefix such a key is written without escapes), enum, const, items, prefixItems, minItems,
// maxItems, anyOf, oneOf (compiled as anyOf: an output matching two alternatives passes anyOf but
// not oneOf), allOf with one member, $ref to any JSON pointer in the document (#/$defs/..,
// #/definitions/.., "#"; recursion allowed: a $ref is a call), nullable, minLength / maxLength,
// integer minimum / maximum / exclusiveMinimum / exclusiveMaximum (exact decimal automata).
// Refused with an Error naming keyword and JSON path: every other keyword (pattern, multipleOf,
// patternProperties, uniqueItems, minProperties, not, if/then/else, ...), number bounds, constraining
// keywords next to $ref / anyOf / allOf / enum / const. Ignored (annotations): title, description,
// examples, default, $schema, $id, $comment, deprecated, readOnly, writeOnly, discriminator.
// format on a string: date-time, date, time (RFC 3339, time with its offset), email (dot-atom local
// part @ dot-separated host labels), uuid, ipv4 (dotted decimal 0-255), uri (scheme ":" then RFC 3986
// characters or %XX) are compiled as the string's grammar (not next to minLength / maxLength); any
// other format is refused by name. On other types format constrains nothing (JSON Schema) and is
// not looked at.
// Array items and $refs are compiled once as rules and called, so bounded arrays stay small.
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "runtime/engine/grammar.h"

namespace lattice {

namespace {

using json = nlohmann::ordered_json;
using grammar_detail::NfaBuilder;

const std::set<std::string>& annotations() {
    static const std::set<std::string> s = {"title",    "description", "examples",  "default",
                                            "$schema",  "$id",         "$comment",  "deprecated",
                                            "readOnly", "writeOnly",   "discriminator", "$defs",
                                            "definitions"};
    return s;
}

const std::set<std::string>& supported() {
    static const std::set<std::string> s = {"type",
                                            "enum",
                                            "const",
                                            "$ref",
                                            "anyOf",
                                            "oneOf",
                                            "allOf",
                                            "nullable",
                                            "properties",
                                            "required",
                                            "additionalProperties",
                                            "items",
                                            "prefixItems",
                                            "minItems",
                                            "maxItems",
                                            "minLength",
                                            "maxLength",
                                            "minimum",
                                            "maximum",
                                            "exclusiveMinimum",
                                            "exclusiveMaximum",
                                            "format"};
    return s;
}

// The string formats compiled as grammars: the characters between the quotes, as a guided_regex
// (none needs JSON escaping: no '"', '\' or control characters).
const char* format_pattern(const std::string& f) {
    static const std::string kDate = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
    static const std::string kTime =
        "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?([Zz]|[+\\-]([01][0-9]|2[0-3]):[0-5][0-9])";
    static const std::string kDateTime = kDate + "[Tt]" + kTime;
    static const std::string kOctet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    static const std::string kIpv4 = "(" + kOctet + "\\.){3}" + kOctet;
    static const std::string kAtom = "[A-Za-z0-9!#$%&'*+/=?^_\\x60{|}~\\-]+";
    static const std::string kLabel = "[A-Za-z0-9]([A-Za-z0-9\\-]*[A-Za-z0-9])?";
    static const std::string kEmail = kAtom + "(\\." + kAtom + ")*@" + kLabel + "(\\." + kLabel + ")+";
    static const std::string kUuid = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    static const std::string kUri =
        "[A-Za-z][A-Za-z0-9+.\\-]*:([A-Za-z0-9\\-._~:/?#\\[\\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*";
    static const std::map<std::string, const std::string*> formats = {
        {"date-time", &kDateTime}, {"date", &kDate}, {"time", &kTime}, {"email", &kEmail},
        {"uuid", &kUuid},          {"ipv4", &kIpv4}, {"uri", &kUri}};
    const auto it = formats.find(f);
    return it == formats.end() ? nullptr : it->second->c_str();
}

std::string show(const std::string& path) {
    return path.empty() ? "/" : path;
}

std::string escape_pointer(const std::string& key) {
    std::string out;
    for (char c : key) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}

bool matches_type(const json& v, const std::string& t) {
    if (t == "string") return v.is_string();
    if (t == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    return false;
}

class SchemaCompiler {
public:
    SchemaCompiler(NfaBuilder& b, const json& root) : b_(b), root_(root) {}
    void emit(const json& s, const std::string& path, int32_t from, int32_t to);

private:
    [[noreturn]] void refuse(const std::string& keyword, const std::string& path,
                             const std::string& why = "is not supported") {
        LATTICE_FAIL("json_schema: \"{}\" at {} {}", keyword, show(path), why);
    }
    // Keywords of s other than annotations and `allowed` are refused (they would constrain validity).
    void only(const json& s, const std::string& path, const std::set<std::string>& allowed, const std::string& why) {
        for (auto it = s.begin(); it != s.end(); ++it)
            if (!annotations().count(it.key()) && !allowed.count(it.key())) refuse(it.key(), path, why);
    }
    std::vector<std::string> types(const json& s, const std::string& path);
    void emit_literals(const json& s, const std::string& path, int32_t from, int32_t to);
    void emit_type(const std::string& t, const json& s, const std::string& path, int32_t from, int32_t to);
    void emit_integer(const json& s, const std::string& path, int32_t from, int32_t to);
    void emit_string(const json& s, const std::string& path, int32_t from, int32_t to);
    void emit_object(const json& s, const std::string& path, int32_t from, int32_t to);
    void emit_array(const json& s, const std::string& path, int32_t from, int32_t to);
    int32_t rule_for(const json& s, const std::string& path);  // s compiled once as a rule; its start
    int32_t ref(const std::string& target, const std::string& path);
    int64_t count(const json& s, const char* key, const std::string& path, int64_t dflt);

    NfaBuilder& b_;
    const json& root_;
    std::map<std::string, int32_t> rules_;  // by JSON pointer
    // Properties emitted in all (OpenAI's structured outputs allow 5000): each costs states and
    // masks over the members still open; past this the schema is refused, not compiled for seconds.
    static constexpr int kMaxProperties = 5000;
    int properties_ = 0;

public:
    std::vector<std::pair<int32_t, std::string>> names_;  // (rule start, JSON pointer) in creation order
};

int64_t SchemaCompiler::count(const json& s, const char* key, const std::string& path, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const json& v = s[key];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
        refuse(key, path, "must be a non-negative integer");
    return std::min<int64_t>(v.get<int64_t>(), INT32_MAX - 1);
}

std::vector<std::string> SchemaCompiler::types(const json& s, const std::string& path) {
    static const std::set<std::string> known = {"string", "integer", "number", "boolean", "null", "object", "array"};
    std::vector<std::string> out;
    if (s.contains("type")) {
        const json& t = s["type"];
        if (t.is_string())
            out.push_back(t.get<std::string>());
        else if (t.is_array())
            for (const json& x : t) out.push_back(x.is_string() ? x.get<std::string>() : "?");
        else
            refuse("type", path, "must be a string or a list of strings");
        for (const std::string& x : out)
            if (!known.count(x)) refuse("type", path, "names an unknown type \"" + x + "\"");
        if (out.empty()) refuse("type", path, "is an empty list");
        return out;
    }
    // No type: the type the keywords imply (a subset of what the schema allows), else any value.
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return {"object"};
    if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems"))
        return {"array"};
    if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) return {"string"};
    if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
        s.contains("exclusiveMaximum"))
        return {"integer"};
    return {};
}

void SchemaCompiler::emit(const json& s, const std::string& path, int32_t from, int32_t to) {
    if (s.is_boolean()) {
        if (s.get<bool>()) return b_.free_value(from, to);
        LATTICE_FAIL("json_schema: the schema at {} is false (nothing validates)", show(path));
    }
    if (!s.is_object()) LATTICE_FAIL("json_schema: the schema at {} is not an object", show(path));
    for (auto it = s.begin(); it != s.end(); ++it)
        if (!annotations().count(it.key()) && !supported().count(it.key())) refuse(it.key(), path);
    if (s.contains("nullable")) {
        if (!s["nullable"].is_boolean()) refuse("nullable", path, "must be a boolean");
        if (s["nullable"].get<bool>()) b_.literal(from, "null", to);
    }
    if (s.contains("$ref")) {
        only(s, path, {"$ref", "nullable"}, "next to \"$ref\" is not supported");
        if (!s["$ref"].is_string()) refuse("$ref", path, "must be a string");
        return b_.call(from, ref(s["$ref"].get<std::string>(), path), to);
    }
    for (const char* k : {"anyOf", "oneOf"}) {
        if (!s.contains(k)) continue;
        only(s, path, {k, "nullable"}, std::string("next to \"") + k + "\" is not supported");
        if (!s[k].is_array() || s[k].empty()) refuse(k, path, "must be a non-empty list");
        for (size_t i = 0; i < s[k].size(); ++i) emit(s[k][i], path + "/" + k + "/" + std::to_string(i), from, to);
        return;
    }
    if (s.contains("allOf")) {
        only(s, path, {"allOf", "nullable"}, "next to \"allOf\" is not supported");
        if (!s["allOf"].is_array() || s["allOf"].size() != 1)
            refuse("allOf", path, "with other than one member is not supported");
        return emit(s["allOf"][0], path + "/allOf/0", from, to);
    }
    if (s.contains("enum") || s.contains("const")) return emit_literals(s, path, from, to);
    const std::vector<std::string> ts = types(s, path);
    if (ts.empty()) return b_.free_value(from, to);
    for (const std::string& t : ts) emit_type(t, s, path, from, to);
}

void SchemaCompiler::emit_literals(const json& s, const std::string& path, int32_t from, int32_t to) {
    only(s, path, {"enum", "const", "type", "nullable"}, "next to \"enum\" / \"const\" is not supported");
    std::vector<json> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) refuse("enum", path, "must be a non-empty list");
        for (const json& v : s["enum"])
            if (!s.contains("const") || v == s["const"]) values.push_back(v);
    }
    const std::vector<std::string> ts = s.contains("type") ? types(s, path) : std::vector<std::string>{};
    int emitted = 0;
    for (const json& v : values) {
        bool ok = ts.empty();
        for (const std::string& t : ts) ok |= matches_type(v, t);
        if (!ok) continue;
        b_.literal(from, v.dump(), to);
        ++emitted;
    }
    if (emitted == 0) refuse(s.contains("enum") ? "enum" : "const", path, "leaves no value of the schema's type");
}

void SchemaCompiler::emit_type(const std::string& t, const json& s, const std::string& path, int32_t from, int32_t to) {
    if (t == "string") return emit_string(s, path, from, to);
    if (t == "integer") return emit_integer(s, path, from, to);
    if (t == "number") {
        for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
            if (s.contains(k)) refuse(k, path, "on a number is not supported (only on an integer)");
        return b_.json_number(from, to);
    }
    if (t == "boolean") {
        b_.literal(from, "true", to);
        return b_.literal(from, "false", to);
    }
    if (t == "null") return b_.literal(from, "null", to);
    if (t == "object") return emit_object(s, path, from, to);
    return emit_array(s, path, from, to);
}

void SchemaCompiler::emit_integer(const json& s, const std::string& path, int32_t from, int32_t to) {
    int64_t lo = -grammar_detail::kMaxIntegerMagnitude, hi = grammar_detail::kMaxIntegerMagnitude;
    const double big = double(grammar_detail::kMaxIntegerMagnitude);
    auto bound = [&](const char* k) -> double {
        if (!s[k].is_number()) refuse(k, path, "must be a number");
        return std::clamp(s[k].get<double>(), -big - 1, big + 1);
    };
    if (s.contains("minimum")) lo = std::max(lo, int64_t(std::ceil(bound("minimum"))));
    if (s.contains("exclusiveMinimum")) lo = std::max(lo, int64_t(std::floor(bound("exclusiveMinimum"))) + 1);
    if (s.contains("maximum")) hi = std::min(hi, int64_t(std::floor(bound("maximum"))));
    if (s.contains("exclusiveMaximum")) hi = std::min(hi, int64_t(std::ceil(bound("exclusiveMaximum"))) - 1);
    if (lo > hi) refuse("minimum", path, fmt::format("and maximum leave no integer ({}..{})", lo, hi));
    b_.json_integer(from, to, lo, hi);
}

void SchemaCompiler::emit_string(const json& s, const std::string& path, int32_t from, int32_t to) {
    if (s.contains("format")) {
        if (!s["format"].is_string()) refuse("format", path, "must be a string");
        const std::string f = s["format"].get<std::string>();
        const char* pattern = format_pattern(f);
        if (!pattern)
            refuse("format", path,
                   "\"" + f + "\" is not supported (supported: date-time, date, time, email, uuid, ipv4, uri)");
        if (s.contains("minLength") || s.contains("maxLength"))
            refuse("format", path, "next to minLength / maxLength is not supported");
        const int32_t open = b_.state(), close = b_.state();
        b_.byte(from, '"', '"', open);
        regex_fragment(b_, pattern, open, close);
        return b_.byte(close, '"', '"', to);
    }
    const int64_t lo = count(s, "minLength", path, 0), hi = count(s, "maxLength", path, NfaBuilder::kUnbounded);
    if (lo > hi) refuse("minLength", path, "is greater than maxLength");
    if (hi != NfaBuilder::kUnbounded && hi > 100000) refuse("maxLength", path, "above 100000 is not supported");
    if (lo > 100000) refuse("minLength", path, "above 100000 is not supported");
    b_.json_string(from, to, int32_t(lo), int32_t(hi));
}

void SchemaCompiler::emit_object(const json& s, const std::string& path, int32_t from, int32_t to) {
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) refuse("properties", path, "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
        if (!s["required"].is_array()) refuse("required", path, "must be a list");
        for (const json& r : s["required"]) {
            if (!r.is_string()) refuse("required", path, "must list strings");
            if (!props.contains(r.get<std::string>()))
                refuse("required", path,
                       "names \"" + r.get<std::string>() + "\", which is not in \"properties\" (not supported)");
            required.insert(r.get<std::string>());
        }
    }
    const json* extra = nullptr;  // schema of further keys, if any are allowed
    if (s.contains("additionalProperties")) {
        const json& ap = s["additionalProperties"];
        if (!ap.is_boolean() && !ap.is_object()) refuse("additionalProperties", path, "must be a boolean or a schema");
        if (!(ap.is_boolean() && !ap.get<bool>())) extra = &ap;
    } else if (props.empty()) {
        static const json any = true;
        extra = &any;  // {"type": "object"} alone: any object
    }
    const int32_t open = b_.state();
    b_.byte(from, '{', '{', open);
    int32_t none = open, some = -1;  // "no member yet" / "after a member"; -1: unreachable
    auto member_start = [&]() {
        const int32_t ks = b_.state();
        if (none >= 0) b_.eps(none, ks);
        if (some >= 0) {
            const int32_t c = b_.state();
            b_.byte(some, ',', ',', c);
            b_.eps(b_.opt_space(c), ks);
        }
        return ks;
    };
    for (auto it = props.begin(); it != props.end(); ++it) {
        if (++properties_ > kMaxProperties)
            refuse("properties", path,
                   fmt::format("brings the schema past {} properties in all (not supported)", kMaxProperties));
        const int32_t ks = member_start(), kv = b_.state(), after = b_.state();
        b_.literal(ks, json(it.key()).dump() + ":", kv);
        emit(it.value(), path + "/properties/" + escape_pointer(it.key()), b_.opt_space(kv), after);
        if (required.count(it.key())) {
            none = -1;
        } else if (some >= 0) {
            b_.eps(some, after);
        }
        some = after;
    }
    if (extra) {
        const int32_t ks = member_start(), key = b_.state(), kv = b_.state(), after = b_.state();
        std::vector<std::string> names;  // further keys are none of the declared ones
        for (auto it = props.begin(); it != props.end(); ++it) names.push_back(it.key());
        b_.json_string_except(ks, key, names);
        b_.byte(key, ':', ':', kv);
        const bool free = extra->is_boolean();
        if (free)
            b_.free_value(b_.opt_space(kv), after);
        else
            b_.call(b_.opt_space(kv), rule_for(*extra, path + "/additionalProperties"), after);
        if (some >= 0) b_.eps(some, after);
        some = after;
        const int32_t c = b_.state();
        b_.byte(some, ',', ',', c);
        b_.eps(b_.opt_space(c), ks);
    }
    if (none >= 0) b_.byte(none, '}', '}', to);
    if (some >= 0) b_.byte(some, '}', '}', to);
}

void SchemaCompiler::emit_array(const json& s, const std::string& path, int32_t from, int32_t to) {
    std::vector<int32_t> prefix;
    if (s.contains("prefixItems")) {
        if (!s["prefixItems"].is_array()) refuse("prefixItems", path, "must be a list");
        for (size_t i = 0; i < s["prefixItems"].size(); ++i)
            prefix.push_back(rule_for(s["prefixItems"][i], path + "/prefixItems/" + std::to_string(i)));
    }
    int64_t min = count(s, "minItems", path, 0), max = count(s, "maxItems", path, INT64_MAX);
    int32_t rest = -1;  // rule of the items after the prefix; -1: none allowed
    if (!s.contains("items")) {
        rest = rule_for(json(true), path + "/items");
    } else if (s["items"].is_array()) {
        refuse("items", path, "as a list is not supported (use prefixItems)");
    } else if (!(s["items"].is_boolean() && !s["items"].get<bool>())) {
        rest = rule_for(s["items"], path + "/items");
    } else {
        max = std::min<int64_t>(max, int64_t(prefix.size()));
    }
    if (min > max) refuse("minItems", path, "is greater than the number of items allowed");
    if (max != INT64_MAX && max > 100000) refuse("maxItems", path, "above 100000 is not supported");
    int32_t cur = b_.state();
    b_.byte(from, '[', '[', cur);
    for (int64_t i = 0;; ++i) {
        if (i >= min) b_.byte(cur, ']', ']', to);
        if (i == max) return;
        int32_t sep = cur;
        if (i > 0) {
            sep = b_.state();
            b_.byte(cur, ',', ',', sep);
            sep = b_.opt_space(sep);
        }
        if (i >= int64_t(prefix.size()) && i >= min && max == INT64_MAX) {  // the unbounded tail: a loop
            const int32_t after = b_.state(), c = b_.state();
            b_.call(sep, rest, after);
            b_.byte(after, ']', ']', to);
            b_.byte(after, ',', ',', c);
            b_.call(b_.opt_space(c), rest, after);
            return;
        }
        const int32_t next = b_.state();
        b_.call(sep, i < int64_t(prefix.size()) ? prefix[size_t(i)] : rest, next);
        cur = next;
    }
}

int32_t SchemaCompiler::rule_for(const json& s, const std::string& path) {
    auto it = rules_.find(path);
    if (it != rules_.end()) return it->second;
    const auto [start, end] = b_.rule();
    rules_[path] = start;
    names_.emplace_back(start, show(path));
    emit(s, path, start, end);
    return start;
}

int32_t SchemaCompiler::ref(const std::string& target, const std::string& path) {
    if (target.empty() || target[0] != '#')
        refuse("$ref", path, "to \"" + target + "\" is not supported (only local #/... references)");
    const std::string ptr = target.substr(1);
    auto it = rules_.find(ptr);
    if (it != rules_.end()) return it->second;
    json::json_pointer jp;
    try {
        jp = json::json_pointer(ptr);
    } catch (const std::exception&) {
        refuse("$ref", path, "\"" + target + "\" is not a JSON pointer");
    }
    if (!root_.contains(jp)) refuse("$ref", path, "\"" + target + "\" does not resolve");
    return rule_for(root_.at(jp), ptr);
}

}  // namespace

grammar_detail::Nfa compile_json_schema(const std::string& schema_text) {
    json root;
    try {
        root = json::parse(schema_text);
    } catch (const std::exception& e) {
        LATTICE_FAIL("json_schema: the schema is not valid JSON ({})", e.what());
    }
    NfaBuilder b;
    const int32_t s = b.state(), f = b.state();
    SchemaCompiler c(b, root);
    c.emit(root, "", s, f);
    grammar_detail::Nfa n = b.finish(s, f);
    n.rule_names = std::move(c.names_);
    return n;
}

}  // namespace lattice
