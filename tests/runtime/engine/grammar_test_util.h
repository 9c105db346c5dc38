// Helpers of the structured-output tests (test_grammar.cpp, test_grammar_walks.cpp): a synthetic vocabulary
// (single bytes, multi-byte tokens, an end id), compile(), matches() (fed whole and byte by byte, which must
// agree), a checker of the supported JSON-schema keywords on a parsed value, the random walk over the mask
// (checked against accept() at every step) and a schema that uses every supported keyword. Header-only,
// doctest's assertions (included by doctest test files only).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/grammar.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice::grammar_test {

using json = nlohmann::json;

// 256 single bytes, then multi-byte tokens, then an end id and a pad id (both empty).
struct Synthetic {
    std::shared_ptr<const TokenVocab> vocab;
    int32_t end_id = 0;
};

inline Synthetic synthetic_vocab() {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    for (const char* s : {"{\"",  "\":", "\": ", "\", \"",  "\"}",      "\"}}",     "true",   "false",
                          "null", " \"", "ab",   "abc\"",   "a\"}",     "12",       "345",    "-1",
                          ".5",   "e+",  "\\n",  "\\u00e9", "\xC3\xA9", "\xE2\x82", "\xAC\"", "name",
                          "age",  "[1",  ", ",   "],",      "}]",       "\":\"",    "\"a",    "\xF0\x9F\x98\x80",
                          "  ",   "\n"})
        t.push_back(s);
    Synthetic v;
    v.end_id = int32_t(t.size());
    t.push_back("");
    t.push_back("");  // padding
    v.vocab = std::make_shared<const TokenVocab>(t, std::vector<int32_t>{v.end_id});
    return v;
}

inline std::shared_ptr<const Grammar> compile(GrammarSpec::Kind kind, const std::string& source,
                                       std::vector<std::string> choices = {}) {
    GrammarSpec spec;
    spec.kind = kind;
    spec.source = source;
    spec.choices = std::move(choices);
    return Grammar::compile(spec);
}

// Whether the bytes are a whole match, fed whole and byte by byte (both must agree).
inline bool matches(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenVocab>& v,
             const std::string& s) {
    GrammarMatcher whole(g, v), bytewise(g, v);
    const bool a = whole.accept_bytes(s) && whole.complete();
    bool b = true;
    for (char c : s) b = b && bytewise.accept_bytes(std::string(1, c));
    b = b && bytewise.complete();
    CHECK_MESSAGE(a == b, s);
    return a;
}

inline bool bit(std::span<const uint32_t> w, int32_t id) {
    return (w[size_t(id / 32)] >> (id % 32)) & 1u;
}

inline size_t utf8_chars(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
    return n;
}

// The supported keywords, checked on a parsed value (oneOf as anyOf, like the compiler).
inline bool valid(const json& v, const json& s, const json& root) {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("nullable") && s["nullable"].get<bool>() && v.is_null()) return true;
    if (s.contains("$ref")) return valid(v, root.at(json::json_pointer(s["$ref"].get<std::string>().substr(1))), root);
    for (const char* k : {"anyOf", "oneOf"})
        if (s.contains(k)) {
            for (const json& alt : s[k])
                if (valid(v, alt, root)) return true;
            return false;
        }
    if (s.contains("allOf")) return valid(v, s["allOf"][0], root);
    if (s.contains("const") && v != s["const"]) return false;
    if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
    if (s.contains("type")) {
        bool ok = false;
        for (const json& tj : s["type"].is_array() ? s["type"] : json::array({s["type"]})) {
            const std::string t = tj;
            ok |= t == "object"    ? v.is_object()
                  : t == "array"   ? v.is_array()
                  : t == "string"  ? v.is_string()
                  : t == "integer" ? v.is_number_integer()
                  : t == "number"  ? v.is_number()
                  : t == "boolean" ? v.is_boolean()
                                   : v.is_null();
        }
        if (!ok) return false;
    }
    if (v.is_string()) {
        const size_t n = utf8_chars(v.get<std::string>());
        if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
        if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
    }
    if (v.is_number_integer()) {
        if (s.contains("minimum") && v.get<int64_t>() < s["minimum"].get<int64_t>()) return false;
        if (s.contains("maximum") && v.get<int64_t>() > s["maximum"].get<int64_t>()) return false;
    }
    if (v.is_object() && s.contains("additionalProperties") && s["additionalProperties"].is_object())
        for (auto it = v.begin(); it != v.end(); ++it)
            if (!valid(it.value(), s["additionalProperties"], root)) return false;
    if (v.is_object() && s.contains("properties")) {
        for (const auto& r : s.value("required", json::array()))
            if (!v.contains(r.get<std::string>())) return false;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (s["properties"].contains(it.key())) {
                if (!valid(it.value(), s["properties"][it.key()], root)) return false;
            } else if (!valid(it.value(), s.value("additionalProperties", json(false)), root)) {
                return false;  // additionalProperties absent counts as false here, as in the compiler
            }
        }
    }
    if (v.is_array()) {
        if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
        if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
        const json prefix = s.value("prefixItems", json::array());
        for (size_t i = 0; i < v.size(); ++i) {
            const json& sub = i < prefix.size() ? prefix[i] : s.value("items", json(true));
            if (!valid(v[i], sub, root)) return false;
        }
    }
    return true;
}

// Random walk: picks allowed tokens (half the time among those that close something, so walks end),
// checking the mask against accept() on a sample of ids at every step. Returns the bytes produced.
inline std::string random_walk(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenVocab>& v,
                        std::mt19937& rng, int checks_per_step = 24) {
    GrammarMatcher m(g, v);
    std::vector<uint32_t> words(size_t((v->size() + 31) / 32));
    std::string out;
    for (int step = 0; step < 4000; ++step) {
        m.fill_mask(words);
        std::vector<int32_t> allowed, closing;
        for (int32_t id = 0; id < v->size(); ++id) {
            if (!bit(words, id)) continue;
            allowed.push_back(id);
            const std::string& b = v->bytes(id);
            if (v->is_end(id) || b.find_first_of("\"}]") != std::string::npos) closing.push_back(id);
        }
        REQUIRE(!allowed.empty());
        for (int k = 0; k < checks_per_step; ++k) {
            const int32_t id = k % 2 ? allowed[rng() % allowed.size()] : int32_t(rng() % uint32_t(v->size()));
            GrammarMatcher copy = m;
            CHECK_MESSAGE(copy.accept(id) == bit(words, id), "id ", id, " after ", out);
        }
        const auto& pool = !closing.empty() && rng() % 2 ? closing : allowed;
        const int32_t id = pool[rng() % pool.size()];
        if (v->is_end(id)) {
            CHECK(m.complete());
            return out;
        }
        REQUIRE(m.accept(id));
        out += v->bytes(id);
        if (m.finished()) return out;
    }
    FAIL("the walk did not end: ", out);
    return out;
}

// A schema with every supported keyword ($ref recursion, anyOf, allOf, enum, const, prefixItems, nullable,
// additionalProperties), for the keyword checks and the walks.
inline const std::string kSchema = R"({
  "$defs": {
    "Tag": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                             "child": {"anyOf": [{"$ref": "#/$defs/Tag"}, {"type": "null"}]}},
            "required": ["name"]},
    "Color": {"enum": ["red", "green", "blue"], "type": "string", "title": "Color"}
  },
  "title": "Person",
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12, "description": "who"},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "score": {"type": ["number", "null"]},
    "color": {"allOf": [{"$ref": "#/$defs/Color"}], "default": "red"},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "minItems": 1, "maxItems": 3},
    "point": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": false,
              "minItems": 2},
    "nick": {"type": "string", "nullable": true, "format": "date-time"},
    "kind": {"const": "person"},
    "meta": {"type": "object", "additionalProperties": {"type": "integer", "maximum": 9}}
  },
  "required": ["name", "age", "tags", "kind"],
  "additionalProperties": false
})";

}  // namespace lattice::grammar_test
