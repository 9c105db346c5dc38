// Structured output (runtime/engine/grammar.h): each grammar kind on hand-written valid and invalid
// byte strings (fed whole and byte by byte, which must agree), random walks over the mask (every
// output parses and validates: a small checker of the supported schema keywords below; regex outputs
// against std::regex_match), the mask against accept() on samples of ids at every step, mutated
// documents and random strings (json_object never accepts what does not parse; regexes agree with
// std::regex), refused keywords and regex constructs naming themselves, tokens that split a UTF-8
// character or cross a string's closing quote, exact integer ranges, additional properties that never
// repeat a declared key, spec keys, masks from several threads and after a cache clear, finishing
// masks that end the output within distance() tokens, and a 32k and a 128k real vocabulary
// (../shared/tokenizers).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "runtime/engine/grammar.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace lattice;
using json = nlohmann::json;

namespace {

// 256 single bytes, then multi-byte tokens, then an end id and a pad id (both empty).
struct Synthetic {
    std::shared_ptr<const TokenVocab> vocab;
    int32_t end_id = 0;
};

Synthetic synthetic_vocab() {
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

std::shared_ptr<const Grammar> compile(GrammarSpec::Kind kind, const std::string& source,
                                       std::vector<std::string> choices = {}) {
    GrammarSpec spec;
    spec.kind = kind;
    spec.source = source;
    spec.choices = std::move(choices);
    return Grammar::compile(spec);
}

// Whether the bytes are a whole match, fed whole and byte by byte (both must agree).
bool matches(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenVocab>& v,
             const std::string& s) {
    GrammarMatcher whole(g, v), bytewise(g, v);
    const bool a = whole.accept_bytes(s) && whole.complete();
    bool b = true;
    for (char c : s) b = b && bytewise.accept_bytes(std::string(1, c));
    b = b && bytewise.complete();
    CHECK_MESSAGE(a == b, s);
    return a;
}

bool bit(std::span<const uint32_t> w, int32_t id) {
    return (w[size_t(id / 32)] >> (id % 32)) & 1u;
}

size_t utf8_chars(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
    return n;
}

// The supported keywords, checked on a parsed value (oneOf as anyOf, like the compiler).
bool valid(const json& v, const json& s, const json& root) {
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
std::string random_walk(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenVocab>& v,
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

const std::string kSchema = R"({
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

}  // namespace

TEST_CASE("grammar: json_object accepts compact JSON objects and nothing else") {
    const auto v = synthetic_vocab().vocab;
    const auto g = compile(GrammarSpec::Kind::kJsonObject, "");
    for (const char* ok :
         {"{}", "{\"a\":1}", "{\"a\": [1, 2.5e3, -0.25E-7, \"x\\n\\u00e9\\ud83d\\ude00\"],\"b\":{\"c\":null}}",
          "{\"\xC3\xA9\":true, \"\xF0\x9F\x98\x80\":false}", "{\"a\":[]}", "{\"a\":{}}",
          "{\"\\\"\\\\\\/\\b\\f\\r\\t\":0}"})
        CHECK_MESSAGE(matches(g, v, ok), std::string(ok));
    for (const char* bad : {"[]", "{\"a\":1,}", "{ \"a\":1}", "{\"a\":01}", "{\"a\":\"\x01\"}", "{\"a\":\"\\ud800\"}",
                            "{\"a\":  1}", "{\"a\":\"\xC0\xAF\"}", "{\"a\":\"\xED\xA0\x80\"}",
                            "{\"a\":12345678901234567}", "{\"a\":1.}", "{\"a\":1e123}", "{\"a\":tru}", "{\"a\"}",
                            "{\"a\":\"\\x\"}", "{\"a\":\"\xF4\x90\x80\x80\"}", "{\"a\":1}\n", "{\"a\":1}}"})
        CHECK_MESSAGE(!matches(g, v, bad), std::string(bad));
    GrammarMatcher m(g, v);
    CHECK(!m.complete());
    REQUIRE(m.accept_bytes("{\"a\":1"));
    CHECK(!m.complete());
    REQUIRE(m.accept_bytes("}"));
    CHECK(m.complete());
    CHECK(m.finished());
    auto nested = [](int n) {  // n objects, one inside the other
        std::string s;
        for (int i = 0; i < n; ++i) s += "{\"a\":";
        return s + "1" + std::string(size_t(n), '}');
    };
    CHECK(matches(g, v, nested(32)));
    CHECK(!matches(g, v, nested(33)));  // past the nesting limit
}

TEST_CASE("grammar: mutated documents: whatever json_object accepts parses; regexes agree with std::regex") {
    const auto v = synthetic_vocab().vocab;
    const auto g = compile(GrammarSpec::Kind::kJsonObject, "");
    std::mt19937 rng(5);
    const std::string alphabet = "{}[]\":, 0123456789.eE+-truefalsn\\u\x01\xC3\xA9\xED\xA0\xF0\x9F\x98\x80";
    const std::vector<std::string> seeds = {R"({"a": [1, 2.5e3, {"b": null}], "c": "x\u00e9\n"})",
                                            R"({"k": -0.5, "l": [true, false]})"};
    int accepted = 0;
    for (int i = 0; i < 3000; ++i) {
        std::string d = seeds[size_t(i) % seeds.size()];
        for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) {
            const size_t at = rng() % (d.size() + 1);
            const char c = alphabet[rng() % alphabet.size()];
            switch (rng() % 3) {
                case 0:
                    d.insert(at, 1, c);
                    break;
                case 1:
                    if (at < d.size()) d.erase(at, 1);
                    break;
                default:
                    if (at < d.size()) d[at] = c;
            }
        }
        if (!matches(g, v, d)) continue;
        ++accepted;
        const json j = json::parse(d, nullptr, false);
        CHECK_MESSAGE((!j.is_discarded() && j.is_object()), d);
    }
    CHECK(accepted > 100);  // the check above ran on many documents
    for (const char* pattern : {"(ab|a)*b?c", "[a-c]{2,3}(x|yz)*", "a(b*|c+)d?[^a-c]?", "(a|b)*a(a|b){2}"}) {
        const auto re = compile(GrammarSpec::Kind::kRegex, pattern);
        const std::regex ref(pattern);
        for (int i = 0; i < 1500; ++i) {
            std::string in;
            for (int k = 0, n = int(rng() % 8); k < n; ++k) in += "abcdxyz"[rng() % 7];
            CHECK_MESSAGE(matches(re, v, in) == std::regex_match(in, ref), pattern, " on ", in);
        }
    }
}

TEST_CASE("grammar: json_schema keywords: valid and invalid documents") {
    const auto v = synthetic_vocab().vocab;
    const auto g = compile(GrammarSpec::Kind::kJsonSchema, kSchema);
    const std::string base = R"("name":"Ann","age":41)";
    const std::string tags = R"("tags":[{"name":"x","child":{"name":"y","child":null}}])";
    auto doc = [&](const std::string& extra) { return "{" + base + extra + "," + tags + ",\"kind\":\"person\"}"; };
    CHECK(matches(g, v, doc("")));
    CHECK(matches(g, v, doc(R"(, "score": 1.5, "color":"blue")")));
    CHECK(matches(g, v, doc(R"(,"score":null)")));
    CHECK(matches(g, v,
                  "{\"name\":\"Ann\",\"age\":0," + tags +
                      R"(,"point":[3,true],"nick":null,"kind":"person","meta":{"k":9,"j":-2}})"));
    CHECK(!matches(g, v, doc(R"(,"color":"pink")")));                                          // not in the enum
    CHECK(!matches(g, v, "{\"age\":41,\"name\":\"Ann\"," + tags + ",\"kind\":\"person\"}"));   // schema order
    CHECK(!matches(g, v, "{\"name\":\"Ann\"," + tags + ",\"kind\":\"person\"}"));              // age is required
    CHECK(!matches(g, v, "{\"name\":\"Ann\",\"age\":151," + tags + ",\"kind\":\"person\"}"));  // maximum
    CHECK(!matches(g, v, "{\"name\":\"Ann\",\"age\":-1," + tags + ",\"kind\":\"person\"}"));   // minimum
    CHECK(!matches(g, v, "{\"name\":\"\",\"age\":1," + tags + ",\"kind\":\"person\"}"));       // minLength
    CHECK(matches(g, v,
                  "{\"name\":\"\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\\n\\u00e9xxxx\",\"age\":1," + tags +
                      ",\"kind\":\"person\"}"));
    CHECK(!matches(g, v, "{\"name\":\"1234567890123\",\"age\":1," + tags + ",\"kind\":\"person\"}"));  // maxLength 12
    CHECK(!matches(g, v, "{" + base + ",\"tags\":[],\"kind\":\"person\"}"));                           // minItems
    CHECK(!matches(g, v, "{" + base + ",\"tags\":[{\"name\":\"123456\"}],\"kind\":\"person\"}"));      // $ref maxLength
    CHECK(!matches(g, v, doc(",\"point\":[3]")));                                                      // minItems 2
    CHECK(!matches(g, v, doc(",\"point\":[3,true,1]")));                                               // items false
    CHECK(!matches(g, v, doc(",\"extra\":1")));                                 // additionalProperties
    CHECK(!matches(g, v, "{" + base + "," + tags + ",\"kind\":\"persona\"}"));  // const
    CHECK(!matches(g, v, doc(",\"meta\":{\"k\":10}")));                         // its maximum
}

TEST_CASE("grammar: additional properties never repeat a declared key") {
    const auto v = synthetic_vocab().vocab;
    const auto g =
        compile(GrammarSpec::Kind::kJsonSchema,
                R"({"type":"object","properties":{"a":{"type":"null"},"ab":{"type":"null"},"é":{"type":"null"}},)"
                R"("additionalProperties":{"type":"integer"}})");
    for (const char* ok : {"{}", "{\"a\":null,\"b\":1}", "{\"abc\":1,\"\":2}", "{\"\xC3\xA9x\":1}", "{\"\xC3\xA8\":1}",
                           "{\"ax\\n\":3}", "{\"ab\":null, \"aa\":-1, \"x\\u0041\":0}"})
        CHECK_MESSAGE(matches(g, v, ok), std::string(ok));
    for (const char* bad :
         {"{\"b\":1,\"a\":null}", "{\"a\":1}", "{\"ab\":1}", "{\"\xC3\xA9\":1}", "{\"\\u0061\":1}", "{\"b\":null}"})
        CHECK_MESSAGE(!matches(g, v, bad), std::string(bad));
    const auto free = compile(GrammarSpec::Kind::kJsonSchema,
                              R"({"type":"object","properties":{"x":{"type":"integer"}},"additionalProperties":true})");
    CHECK(matches(free, v, "{\"x\":1,\"y\":[true,{\"x\":2}]}"));
    CHECK(!matches(free, v, "{\"x\":1,\"x\":2}"));
    const auto bare = compile(GrammarSpec::Kind::kJsonSchema, R"({"type":"object"})");  // no properties: any object
    CHECK(matches(bare, v, "{\"x\":1,\"y\":[true,{\"x\":2}]}"));
    CHECK(matches(bare, v, "{}"));
    CHECK(!matches(bare, v, "[]"));
    std::mt19937 rng(3);
    const json schema = json::parse(
        R"({"type":"object","properties":{"ab":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})");
    const auto g2 = compile(GrammarSpec::Kind::kJsonSchema, schema.dump());
    for (int i = 0; i < 20; ++i) {
        const std::string out = random_walk(g2, v, rng);
        const json doc = json::parse(out, nullptr, false);
        CHECK_MESSAGE((!doc.is_discarded() && valid(doc, schema, schema)), out);
    }
}

TEST_CASE("grammar: integer ranges are exact") {
    const auto v = synthetic_vocab().vocab;
    const auto g =
        compile(GrammarSpec::Kind::kJsonSchema, R"({"type":"integer","minimum":-123,"exclusiveMaximum":4567})");
    for (int x = -1200; x <= 6000; ++x) CHECK_MESSAGE(matches(g, v, std::to_string(x)) == (x >= -123 && x < 4567), x);
    CHECK(!matches(g, v, "-0"));
    CHECK(!matches(g, v, "007"));
    const auto pos = compile(GrammarSpec::Kind::kJsonSchema, R"({"type":"integer","exclusiveMinimum":0})");
    CHECK(!matches(pos, v, "0"));
    CHECK(matches(pos, v, "1"));
    CHECK(matches(pos, v, "9999999999999999"));
    CHECK(!matches(pos, v, "10000000000000000"));
}

TEST_CASE("grammar: regex matches like std::regex_match") {
    const auto v = synthetic_vocab().vocab;
    struct Case {
        const char* pattern;
        std::vector<const char*> inputs;
    };
    const std::string x400y = std::string(400, 'x') + "y";
    const std::vector<Case> cases = {
        {"^[A-Z][a-z]{2,4} \\d{3}-\\d{4}$",
         {"Bob 555-1234", "Bo 555-1234", "Bobbyy 555-1234", "Bob 5551234", "bob 555-1234"}},
        {"(ab|cd)*e?", {"", "ab", "abcd", "abce", "e", "ac", "abe", "ee"}},
        {"(?:a|b)+c{2}", {"acc", "abbacc", "ac", "cc", "abaccc"}},
        {"\\w+@\\w+\\.(com|org)", {"a@b.com", "a_1@x.org", "a@b.net", "@b.com", "a@b.comm"}},
        {"[^0-9]x.", {"ax1", "1x1", "axx", "ax\n", "ax"}},
        {"-?\\d+(\\.\\d+)?", {"0", "-12.50", "1.", ".5", "--1"}},
        {"a{3}b{1,}c{0,2}", {"aaab", "aaabbbcc", "aab", "aaabccc", "aaac"}},
        {"(x?){400}y", {"y", "xxy", "xy", x400y.c_str(), "yy"}},
        {"[a\\-z]+\\s\\S", {"a-z x", "-- !", "b x", "a  x"}},
        {"\\(\\)\\[\\]\\{\\}\\.\\*\\\\", {"()[]{}.*\\", "()[]{}.*"}},
    };
    for (const Case& c : cases) {
        const auto g = compile(GrammarSpec::Kind::kRegex, c.pattern);
        std::string p = c.pattern;
        const std::regex re(p);
        for (const char* in : c.inputs)
            CHECK_MESSAGE(matches(g, v, in) == std::regex_match(in, re), c.pattern, " on ", in);
    }
    // A `{` that opens no quantifier is a literal, as in Python (std::regex's ECMAScript refuses it).
    const auto braces = compile(GrammarSpec::Kind::kRegex, "\\{\"a\": \\d+\\}|{x}|a{,2}");
    for (const char* in : {"{\"a\": 12}", "{x}", "a{,2}"}) CHECK_MESSAGE(matches(braces, v, in), std::string(in));
    for (const char* in : {"{\"a\": }", "aa", "x"}) CHECK_MESSAGE(!matches(braces, v, in), std::string(in));
    // Non-ASCII: '.' and negated classes take whole UTF-8 characters only; classes take code point ranges.
    const auto dot = compile(GrammarSpec::Kind::kRegex, "a.b[^x]c[α-ω]");
    CHECK(matches(dot, v,
                  "a\xC3\xA9"
                  "b\xE2\x82\xAC"
                  "c\xCE\xB2"));
    CHECK(!matches(dot, v,
                   "a\xC3"
                   "b!c\xCE\xB2"));
    CHECK(!matches(dot, v, "aeb!c\xCE\xA9\xCE\xB2"));
    CHECK(!matches(dot, v, "aeb!ca"));
}

TEST_CASE("grammar: spec keys") {
    GrammarSpec a{GrammarSpec::Kind::kJsonSchema, R"({"type": "object", "properties": {"b": {}, "a": {}}})", {}};
    GrammarSpec b{GrammarSpec::Kind::kJsonSchema, R"({"type":"object","properties":{"b":{},"a":{}}})", {}};
    GrammarSpec c{GrammarSpec::Kind::kJsonSchema, R"({"type":"object","properties":{"a":{},"b":{}}})", {}};
    CHECK(a.key() == b.key());  // spacing does not matter
    CHECK(a.key() != c.key());  // property order does: it is the output's order
    GrammarSpec r{GrammarSpec::Kind::kRegex, "a+", {}}, ch{GrammarSpec::Kind::kChoice, "", {"a+"}};
    CHECK(r.key() != ch.key());
    CHECK(!GrammarSpec{}.active());
    CHECK(r.active());
}

TEST_CASE("grammar: choice is exactly one of the strings") {
    const auto v = synthetic_vocab().vocab;
    const auto g = compile(GrammarSpec::Kind::kChoice, "", {"yes", "no", "maybe so"});
    for (const char* s : {"yes", "no", "maybe so"}) CHECK(matches(g, v, s));
    for (const char* s : {"", "ye", "yess", "maybe", "No"}) CHECK(!matches(g, v, s));
    GrammarMatcher m(g, v);
    REQUIRE(m.accept_bytes("no"));
    CHECK(m.finished());
}

TEST_CASE("grammar: refused keywords and constructs name themselves") {
    auto schema_error = [](const std::string& s) {
        try {
            compile(GrammarSpec::Kind::kJsonSchema, s);
        } catch (const Error& e) {
            return e.message();
        }
        return std::string("(compiled)");
    };
    CHECK(schema_error(R"({"type":"object","properties":{"name":{"type":"string","pattern":"a+"}}})") ==
          "json_schema: \"pattern\" at /properties/name is not supported");
    CHECK(schema_error(R"({"type":"number","multipleOf":2})").find("\"multipleOf\" at /") != std::string::npos);
    CHECK(schema_error(R"({"type":"object","patternProperties":{"a":{}}})").find("\"patternProperties\"") !=
          std::string::npos);
    CHECK(schema_error(R"({"type":"array","items":{"type":"array","uniqueItems":true}})")
              .find("\"uniqueItems\" at /items") != std::string::npos);
    CHECK(schema_error(R"({"type":"number","minimum":0})").find("\"minimum\" at / on a number") != std::string::npos);
    CHECK(schema_error(R"({"allOf":[{"type":"string"},{"maxLength":3}]})").find("\"allOf\"") != std::string::npos);
    CHECK(schema_error(R"({"$ref":"http://x/y"})").find("\"$ref\"") != std::string::npos);
    CHECK(schema_error(R"({"$ref":"#/$defs/Missing"})").find("does not resolve") != std::string::npos);
    CHECK(schema_error(R"({"anyOf":[{"type":"string"}],"maxLength":3})").find("\"maxLength\"") != std::string::npos);
    CHECK(schema_error(R"({"type":"integer","minimum":5,"maximum":4})").find("no integer") != std::string::npos);
    CHECK(schema_error(R"({"not":{}})").find("\"not\" at /") != std::string::npos);
    CHECK(schema_error("{nope").find("not valid JSON") != std::string::npos);
    auto regex_error = [](const std::string& p) {
        try {
            compile(GrammarSpec::Kind::kRegex, p);
        } catch (const Error& e) {
            return e.message();
        }
        return std::string("(compiled)");
    };
    CHECK(regex_error("(a)\\1") == "guided_regex: a backreference at offset 3 is not supported");
    CHECK(regex_error("a(?=b)").find("lookaround at offset 1") != std::string::npos);
    CHECK(regex_error("a(?<!b)").find("lookaround at offset 1") != std::string::npos);
    CHECK(regex_error("\\bword").find("word boundary") != std::string::npos);
    CHECK(regex_error("a{1001}").find("above 1000") != std::string::npos);
    CHECK(regex_error("((ab?){100}){100}").find("automaton states") != std::string::npos);
    CHECK(regex_error("a^b").find("anchor '^' inside the pattern at offset 1") != std::string::npos);
    CHECK(regex_error("(ab").find("unterminated group") != std::string::npos);
    CHECK(regex_error("*a").find("nothing to repeat") != std::string::npos);
    CHECK(regex_error("(?i)a").find("(?i...)") != std::string::npos);
    CHECK_THROWS_AS(compile(GrammarSpec::Kind::kChoice, "", {}), Error);
    CHECK_THROWS_AS(compile(GrammarSpec::Kind::kNone, ""), Error);
}

TEST_CASE("grammar: tokens that split a UTF-8 character or cross a string's closing quote") {
    const Synthetic s = synthetic_vocab();
    const auto& v = s.vocab;
    auto id_of = [&](const std::string& b) {
        for (int32_t i = 0; i < v->size(); ++i)
            if (v->bytes(i) == b) return i;
        FAIL("no token ", b);
        return -1;
    };
    const auto g = compile(GrammarSpec::Kind::kJsonSchema,
                           R"({"type":"object","properties":{"a":{"type":"string","maxLength":2}},"required":["a"]})");
    GrammarMatcher m(g, v);
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
    REQUIRE(m.accept_bytes("{\"a\":\""));
    m.fill_mask(w);
    CHECK(bit(w, id_of("\xE2\x82")));        // the first two bytes of '€'
    CHECK(!bit(w, id_of("\xAC\"")));         // a continuation byte cannot start a character
    CHECK(bit(w, id_of("a\"}")));            // one character, the closing quote, the object's end
    CHECK(bit(w, id_of("abc\"")) == false);  // three characters: past maxLength
    CHECK(!bit(w, s.end_id));
    REQUIRE(m.accept(id_of("\xE2\x82")));
    m.fill_mask(w);
    CHECK(bit(w, id_of("\xAC\"")));  // completes '€' then closes the string
    CHECK(!bit(w, id_of("a")));
    CHECK(!bit(w, id_of("\"")));
    REQUIRE(m.accept(id_of("\xAC\"")));
    REQUIRE(m.accept(id_of("}")));
    CHECK(m.finished());
    m.fill_mask(w);
    CHECK(bit(w, s.end_id));
    CHECK(m.accept(s.end_id));
    CHECK(!m.accept(v->size() - 1));  // padding is never allowed
}

TEST_CASE("grammar: random walks on a small vocabulary parse and validate") {
    const auto v = synthetic_vocab().vocab;
    std::mt19937 rng(7);
    const auto obj = compile(GrammarSpec::Kind::kJsonObject, "");
    const auto sch = compile(GrammarSpec::Kind::kJsonSchema, kSchema);
    const json schema = json::parse(kSchema);
    for (int i = 0; i < 30; ++i) {
        const std::string a = random_walk(obj, v, rng);
        CHECK_MESSAGE(json::parse(a, nullptr, false).is_object(), a);
        const std::string b = random_walk(sch, v, rng);
        const json doc = json::parse(b, nullptr, false);
        CHECK_MESSAGE(!doc.is_discarded(), b);
        CHECK_MESSAGE(valid(doc, schema, schema), b);
    }
    const char* pattern = "[A-Z][a-z]{2,4}( \\d{1,3})*-(yes|no)";
    const auto re = compile(GrammarSpec::Kind::kRegex, pattern);
    for (int i = 0; i < 30; ++i) {
        const std::string s = random_walk(re, v, rng);
        CHECK_MESSAGE(std::regex_match(s, std::regex(pattern)), s);
    }
}

TEST_CASE("grammar: real vocabularies (32k SentencePiece, 128k byte-level BPE)") {
    const std::string dir = std::string(LATTICE_SHARED_DIR) + "/tokenizers/";
    std::mt19937 rng(11);
    const json schema = json::parse(kSchema);
    const auto sch = compile(GrammarSpec::Kind::kJsonSchema, kSchema);  // one grammar, both vocabularies (its memo)
    for (const char* file : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf"}) {
        const auto tok = load_tokenizer(dir + file);
        const auto v = make_token_vocab(*tok, tok->vocab_size() + 64);  // logits wider than the vocabulary
        REQUIRE(v->size() == tok->vocab_size() + 64);
        REQUIRE(!v->end_ids().empty());
        for (int i = 0; i < 3; ++i) {
            const std::string b = random_walk(sch, v, rng, 64);
            const json doc = json::parse(b, nullptr, false);
            CHECK_MESSAGE(!doc.is_discarded(), b);
            CHECK_MESSAGE(valid(doc, schema, schema), b);
        }
        // A document tokenized greedily by the tokenizer is accepted token by token (byte-level: no
        // SentencePiece dummy-prefix space in front).
        if (tok->kind() != TokenizerKind::kByteLevel) continue;
        const std::string text = R"({"name":"Zoë Δ","age":33,"tags":[{"name":"a b","child":null}],"kind":"person"})";
        GrammarMatcher m(sch, v);
        for (int32_t id : tok->encode(text)) REQUIRE_MESSAGE(m.accept(id), file, " token ", id);
        CHECK(m.finished());
    }
}

TEST_CASE("grammar: one grammar masked from several threads, or after its cache is cleared, gives the same masks") {
    const auto v = synthetic_vocab().vocab;
    const auto g = compile(GrammarSpec::Kind::kJsonObject, "");
    const std::string doc = R"({"a": [1, {"b": "x\u00e9y"}, true], "c": {"d": null, "e": -2.5e-3}})";
    auto masks = [&]() {
        std::vector<std::vector<uint32_t>> out;
        GrammarMatcher m(g, v);
        for (char c : doc) {
            std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
            m.fill_mask(w);
            out.push_back(w);
            REQUIRE(m.accept_bytes(std::string(1, c)));
        }
        return out;
    };
    std::vector<std::vector<std::vector<uint32_t>>> results(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < results.size(); ++t) threads.emplace_back([&, t] { results[t] = masks(); });
    for (auto& t : threads) t.join();
    const auto fresh = compile(GrammarSpec::Kind::kJsonObject, "");
    GrammarMatcher m(fresh, v);
    for (size_t i = 0; i < doc.size(); ++i) {
        std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
        m.fill_mask(w);
        for (const auto& r : results) CHECK(r[i] == w);
        fresh->cache().clear();  // what a full cache does at the start of a mask: the same masks again
        std::vector<uint32_t> again(w.size());
        m.fill_mask(again);
        CHECK(again == w);
        REQUIRE(m.accept_bytes(doc.substr(i, 1)));
    }
}

TEST_CASE("grammar: finishing masks end the output within distance() tokens, well-formed") {
    const auto v = synthetic_vocab().vocab;
    std::mt19937 rng(13);
    const json schema = json::parse(kSchema);
    const auto obj = compile(GrammarSpec::Kind::kJsonObject, "");
    const auto sch = compile(GrammarSpec::Kind::kJsonSchema, kSchema);
    const auto re = compile(GrammarSpec::Kind::kRegex, "[A-Z][a-z]{2,4}( \\d{1,3})*-(yes|no)");
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32)), all(w.size());
    for (int i = 0; i < 60; ++i) {
        const auto& g = i % 3 == 0 ? obj : i % 3 == 1 ? sch : re;
        GrammarMatcher m(g, v);
        std::string out;
        for (int k = 0, free_steps = int(rng() % 40); k < free_steps && !m.finished(); ++k) {  // uniform: long strings
            m.fill_mask(w);
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < v->size(); ++id)
                if (bit(w, id) && !v->is_end(id)) allowed.push_back(id);
            if (allowed.empty()) break;
            const int32_t id = allowed[rng() % allowed.size()];
            REQUIRE(m.accept(id));
            out += v->bytes(id);
        }
        const int32_t budget = m.distance();
        REQUIRE(budget < 1000);
        int used = 0;
        while (!m.complete() || !m.finished()) {
            const int32_t before = m.distance();
            m.fill_mask_finishing(w);
            m.fill_mask(all);
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < v->size(); ++id) {
                if (!bit(w, id)) continue;
                CHECK(bit(all, id));  // a subset of the mask
                allowed.push_back(id);
            }
            REQUIRE(!allowed.empty());
            const int32_t id = allowed[rng() % allowed.size()];
            if (v->is_end(id)) break;
            REQUIRE(m.accept(id));
            out += v->bytes(id);
            ++used;
            CHECK(m.distance() < before);
        }
        CHECK(m.complete());
        CHECK_MESSAGE(used <= budget, out);
        if (g == re) {
            CHECK_MESSAGE(std::regex_match(out, std::regex("[A-Z][a-z]{2,4}( \\d{1,3})*-(yes|no)")), out);
        } else {
            const json doc = json::parse(out, nullptr, false);
            CHECK_MESSAGE(!doc.is_discarded(), out);
            if (g == sch) CHECK_MESSAGE(valid(doc, schema, schema), out);
        }
    }
}

TEST_CASE("grammar: a pydantic model_json_schema and an OpenAI strict schema compile and walk to valid output") {
    const auto v = synthetic_vocab().vocab;
    std::mt19937 rng(17);
    const std::vector<std::string> schemas = {
        // class Pet(BaseModel): kind: Literal["cat", "dog"]; name: str
        // class User(BaseModel): id: conint(ge=1); name: str = Field(max_length=8); nick: Optional[str] = None;
        //   color: Color = Color.red; pets: list[Pet] = []; scores: dict[str, int] = {}; born: datetime;
        //   pair: tuple[int, bool]
        R"({"$defs": {"Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
                      "Pet": {"properties": {"kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"},
                                             "name": {"title": "Name", "type": "string"}},
                              "required": ["kind", "name"], "title": "Pet", "type": "object"}},
            "properties": {"id": {"minimum": 1, "title": "Id", "type": "integer"},
                           "name": {"maxLength": 8, "title": "Name", "type": "string"},
                           "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Nick"},
                           "color": {"$ref": "#/$defs/Color", "default": "red"},
                           "pets": {"default": [], "items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array"},
                           "scores": {"additionalProperties": {"type": "integer"}, "default": {}, "title": "Scores",
                                      "type": "object"},
                           "born": {"format": "date-time", "title": "Born", "type": "string"},
                           "pair": {"maxItems": 2, "minItems": 2, "prefixItems": [{"type": "integer"}, {"type": "boolean"}],
                                    "title": "Pair", "type": "array"}},
            "required": ["id", "name", "born", "pair"], "title": "User", "type": "object"})",
        // OpenAI strict: every property required, nullable through a type list, no additional properties.
        R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": ["integer", "null"]},
             "units": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "days", "units"],
             "additionalProperties": false})"};
    for (const std::string& text : schemas) {
        const json schema = json::parse(text);
        const auto g = compile(GrammarSpec::Kind::kJsonSchema, text);
        for (int i = 0; i < 15; ++i) {
            const std::string out = random_walk(g, v, rng, 8);
            const json doc = json::parse(out, nullptr, false);
            CHECK_MESSAGE((!doc.is_discarded() && valid(doc, schema, schema)), out);
        }
    }
}
