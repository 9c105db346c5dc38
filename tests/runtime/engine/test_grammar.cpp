// Structured output (runtime/engine/grammar.h), each grammar kind on hand-written valid and invalid
// byte strings (fed whole and byte by byte, which must agree): mutated documents and random strings
// (json_object never accepts what does not parse; regexes agree with std::regex), the schema keywords
// (checked on walks by the keyword checker of grammar_test_util.h), refused keywords and regex constructs
// naming themselves, tokens that split a UTF-8 character or cross a string's closing quote, exact integer
// ranges, additional properties that never repeat a declared key, spec keys. Whole outputs (random walks,
// real vocabularies, threads, finishing masks) are test_grammar_walks.cpp's.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/engine/grammar.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/runtime/engine/grammar_test_util.h"

using namespace lattice;
using namespace lattice::grammar_test;  // its json is nlohmann::json

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
