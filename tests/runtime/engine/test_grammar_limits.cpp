// Structured output against hostile or degenerate specs (runtime/engine/grammar.h): schemas and
// regexes that admit no finite document are refused naming why (a $ref loop, a -> b -> a, anyOf of
// itself, an object that requires itself, nesting past the stack bound, a class that matches
// nothing) while recursion with a way out still compiles; 1000 and 5000 required properties compile
// and finish within the distance they report; the string formats are grammars (valid and invalid
// values) or refused by name; min_remaining_tokens() is exact on a small vocabulary, and masks from
// fill_mask_within() end every output well-formed when max_tokens is the shortest document's tokens.
#include <doctest/doctest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/engine/grammar.h"
#include "runtime/tokenizer/tokenizer.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_grammar_limits {

using namespace lattice;
using json = nlohmann::json;

namespace {

std::shared_ptr<const Grammar> compile(GrammarSpec::Kind kind, const std::string& source) {
    GrammarSpec spec;
    spec.kind = kind;
    spec.source = source;
    return Grammar::compile(spec);
}

std::string error_of(GrammarSpec::Kind kind, const std::string& source) {
    try {
        compile(kind, source);
    } catch (const Error& e) {
        return e.message();
    }
    return "(compiled)";
}

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Every single byte, a few multi-byte JSON pieces, an end id.
std::shared_ptr<const TokenVocab> vocab(const std::vector<std::string>& extra, int32_t* end_id = nullptr) {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    t.insert(t.end(), extra.begin(), extra.end());
    const int32_t end = int32_t(t.size());
    t.push_back("");
    if (end_id) *end_id = end;
    return std::make_shared<const TokenVocab>(t, std::vector<int32_t>{end});
}

bool bit(std::span<const uint32_t> w, int32_t id) {
    return (w[size_t(id / 32)] >> (id % 32)) & 1u;
}

bool matches(const std::shared_ptr<const Grammar>& g, const std::string& s) {
    GrammarMatcher m(g, vocab({}));
    return m.accept_bytes(s) && m.complete();
}

std::string required_props(int n) {
    nlohmann::ordered_json s = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
    for (int i = 0; i < n; ++i) {
        const std::string k = "p" + std::to_string(i);
        s["properties"][k] = {{"type", i % 2 ? "integer" : "string"}};
        s["required"].push_back(k);
    }
    return s.dump();
}

}  // namespace

TEST_CASE("grammar limits: a schema or regex that admits no finite document is refused, naming why") {
    using K = GrammarSpec::Kind;
    const std::string self = error_of(K::kJsonSchema, R"({"$ref":"#"})");
    CHECK(has(self, "json_schema: no finite document matches: / can never end"));
    const std::string loop = error_of(K::kJsonSchema, R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})");
    CHECK(has(loop, "/$defs/a can never end"));
    const std::string ab =
        error_of(K::kJsonSchema, R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})");
    CHECK(has(ab, "/$defs/a, /$defs/b can never end"));
    CHECK(has(error_of(K::kJsonSchema, R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"})"),
              "/$defs/a can never end"));
    const std::string requires_itself =
        error_of(K::kJsonSchema, R"({"type":"object","properties":{"self":{"$ref":"#"}},"required":["self"]})");
    CHECK(has(requires_itself, "no finite document matches: / can never end"));
    CHECK(has(requires_itself, "required property"));
    // Finite but deeper than a configuration's stack.
    json deep = {{"type", "integer"}};
    for (int i = 0; i < 40; ++i)
        deep = {{"type", "array"}, {"items", deep}, {"minItems", 1}};
    CHECK(has(error_of(K::kJsonSchema, deep.dump()), "nests deeper than 32 levels"));
    // Regexes that match nothing.
    CHECK(error_of(K::kRegex, "[^\\s\\S]") == "guided_regex: nothing matches it (no finite output ends it)");
    CHECK(has(error_of(K::kRegex, "ab[^\\d\\D]c|x[^\\w\\W]"), "nothing matches it"));
    // Recursion with a way out still compiles: optional self, a nullable child, arrays that may be empty.
    CHECK(error_of(K::kJsonSchema, R"({"type":"object","properties":{"self":{"$ref":"#"}}})") == "(compiled)");
    CHECK(error_of(K::kJsonSchema, R"({"$defs":{"t":{"type":"object","properties":{"c":{"anyOf":[{"$ref":"#/$defs/t"},
              {"type":"null"}]}},"required":["c"]}},"$ref":"#/$defs/t"})") == "(compiled)");
    CHECK(error_of(K::kJsonSchema, R"({"type":"array","items":{"$ref":"#"}})") == "(compiled)");
    CHECK(error_of(K::kRegex, "[^\\s\\S]|ok") == "(compiled)");
    // A branch that can never end is never entered: after "x" only "y" is allowed (found by fuzz_grammar:
    // the mask was empty on a prefix of such a branch).
    const auto dead = compile(K::kRegex, "xy|xqa[^\\d\\D]z|x[^\\w\\W]");
    const auto v = vocab({});
    GrammarMatcher m(dead, v);
    REQUIRE(m.accept_bytes("x"));
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
    m.fill_mask(w);
    for (int32_t id = 0; id < v->size(); ++id) CHECK_MESSAGE(bit(w, id) == (id == 'y'), id);
    // Bytes that are no UTF-8 character are refused in a pattern (they made a partial character).
    CHECK(has(error_of(K::kRegex, "a\xfd\xf5\x02b"), "invalid UTF-8"));
    CHECK(has(error_of(K::kRegex, "\xed\xa0\x80"), "invalid UTF-8"));  // a surrogate
}

TEST_CASE("grammar limits: 1000 and 5000 required properties compile and report a finite distance") {
    for (const int n : {3, 1000, 5000}) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto g = compile(GrammarSpec::Kind::kJsonSchema, required_props(n));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        MESSAGE(n << " required properties: " << g->nfa().num_states() << " states, compiled in " << secs << " s");
        const auto v = vocab({});
        GrammarMatcher m(g, v);
        // The shortest document: {"p0":"","p1":0,...}
        std::string shortest = "{";
        for (int i = 0; i < n; ++i) shortest += (i ? ",\"p" : "\"p") + std::to_string(i) + (i % 2 ? "\":0" : "\":\"\"");
        shortest += "}";
        CHECK(m.distance() == int32_t(shortest.size()));
        CHECK(m.min_remaining_tokens() == int32_t(shortest.size()));  // single-byte tokens only
        CHECK_MESSAGE(matches(g, shortest), shortest.substr(0, 80));
        if (n == 1000) {  // finishing masks walk it to the end within the distance
            std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
            int used = 0;
            while (!m.complete()) {
                m.fill_mask_within(w, int64_t(shortest.size()) - used);
                int32_t id = 0;
                while (!bit(w, id) || v->is_end(id)) ++id;
                REQUIRE(m.accept(id));
                ++used;
            }
            CHECK(used == int(shortest.size()));
        }
    }
}

TEST_CASE("grammar limits: past 5000 properties or a million states a schema is refused by name") {
    CHECK(has(error_of(GrammarSpec::Kind::kJsonSchema, required_props(5001)),
              "json_schema: \"properties\" at / brings the schema past 5000 properties in all"));
    // Fewer properties, each a long bounded string: states, not properties, are the limit.
    nlohmann::ordered_json s = {{"type", "object"}, {"properties", json::object()}};
    for (int i = 0; i < 1000; ++i) s["properties"]["k" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 400}};
    const std::string e = error_of(GrammarSpec::Kind::kJsonSchema, s.dump());
    CHECK_MESSAGE(has(e, "the grammar is too large (over 1000000 automaton states)"), e);
}

TEST_CASE("grammar limits: string formats are grammars, other formats are refused by name") {
    auto fmt_schema = [](const std::string& f) { return R"({"type":"string","format":")" + f + "\"}"; };
    const std::vector<std::pair<std::string, std::vector<std::pair<std::string, bool>>>> cases = {
        {"date", {{"2024-02-29", true}, {"2024-13-01", false}, {"2024-1-01", false}, {"12024-01-01", false}}},
        {"time", {{"23:59:60Z", true}, {"08:30:00.123+05:30", true}, {"24:00:00Z", false}, {"08:30:00", false}}},
        {"date-time", {{"2024-09-05T12:00:00Z", true}, {"2024-09-05t12:00:00-01:00", true}, {"2024-09-05 12:00:00Z", false}}},
        {"email", {{"a.b+c@example.co", true}, {"x@y", false}, {"@example.com", false}, {"a@b@c.d", false}}},
        {"uuid", {{"123e4567-e89b-12d3-a456-426614174000", true}, {"123e4567e89b12d3a456426614174000", false}}},
        {"ipv4", {{"192.168.0.255", true}, {"0.0.0.0", true}, {"256.1.1.1", false}, {"01.2.3.4", false}, {"1.2.3", false}}},
        {"uri", {{"https://example.com/a?b=c#d", true}, {"urn:isbn:0451450523", true}, {"a b:c", false},
                 {"http://x/%zz", false}, {"/relative", false}}},
    };
    // Plain names, not structured bindings: clang 14 refuses a binding used inside doctest's message lambda.
    for (const auto& c : cases) {
        const std::string& f = c.first;
        const auto g = compile(GrammarSpec::Kind::kJsonSchema, fmt_schema(f));
        for (const auto& v : c.second) {
            const std::string value = v.first;
            const bool ok = v.second;
            CHECK_MESSAGE(matches(g, json(value).dump()) == ok, f, " ", value);
        }
    }
    CHECK(has(error_of(GrammarSpec::Kind::kJsonSchema, fmt_schema("ipv6")),
              "json_schema: \"format\" at / \"ipv6\" is not supported (supported: date-time"));
    CHECK(has(error_of(GrammarSpec::Kind::kJsonSchema, R"({"type":"string","format":"date","maxLength":4})"),
              "next to minLength / maxLength"));
    // On other types format constrains nothing: not looked at.
    CHECK(error_of(GrammarSpec::Kind::kJsonSchema, R"({"type":"integer","format":"int64"})") == "(compiled)");
    // A format alone implies a string.
    CHECK(matches(compile(GrammarSpec::Kind::kJsonSchema, R"({"format":"uuid"})"),
                  "\"123e4567-e89b-12d3-a456-426614174000\""));
}

TEST_CASE("grammar limits: min_remaining_tokens counts tokens, not bytes") {
    const auto v = vocab({"{\"age\":", ",\"name\":\"\"}", ", \"name\": \"", "\"name\":\"", "\"}"});
    const auto g = compile(GrammarSpec::Kind::kJsonSchema,
                           R"({"type":"object","properties":{"age":{"type":"integer"},"name":{"type":"string"}},
                               "required":["age","name"]})");
    GrammarMatcher m(g, v);
    CHECK(m.distance() == 19);  // {"age":0,"name":""}
    CHECK(m.min_remaining_tokens() == 3);  // {"age":  0  ,"name":""}
    REQUIRE(m.accept_bytes("{\"age\":6"));
    CHECK(m.min_remaining_tokens() == 1);
    REQUIRE(m.accept_bytes(", "));  // the optional space: now "name":" and "} are needed
    CHECK(m.min_remaining_tokens() == 2);
    REQUIRE(m.accept_bytes("\"name\":\"x\"}"));
    CHECK(m.min_remaining_tokens() == 0);
}

TEST_CASE("grammar limits: with max_tokens at the shortest document, fill_mask_within ends every output well-formed") {
    // Finding: at max_tokens 10 and 12, 11 of 12 outputs of an 8-token schema ended malformed
    // ({"age":6, "name":"") because optional spaces were spent inside the byte-based reserve.
    const auto v = vocab({"{\"", "age", "name", "\":", "\": ", "\",\"", ", \"", "\"}", "12", " ", "  ", "ab", "\""});
    const auto g = compile(GrammarSpec::Kind::kJsonSchema,
                           R"({"type":"object","properties":{"age":{"type":"integer"},"name":{"type":"string"}},
                               "required":["age","name"]})");
    const int32_t shortest = GrammarMatcher(g, v).min_remaining_tokens();
    MESSAGE("shortest document: " << shortest << " tokens");
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
    std::mt19937 rng(50);
    for (int slack = 0; slack <= 4; ++slack) {
        for (int run = 0; run < 40; ++run) {
            const int64_t max_tokens = shortest + slack;
            GrammarMatcher m(g, v);
            std::string out;
            for (int64_t gen = 0; gen < max_tokens; ++gen) {
                m.fill_mask_within(w, max_tokens - gen);
                std::vector<int32_t> allowed;
                for (int32_t id = 0; id < v->size(); ++id)
                    if (bit(w, id)) allowed.push_back(id);
                REQUIRE(!allowed.empty());
                const int32_t id = allowed[rng() % allowed.size()];
                if (v->is_end(id)) break;
                REQUIRE(m.accept(id));
                out += v->bytes(id);
            }
            CHECK_MESSAGE(m.complete(), "max_tokens ", max_tokens, ": ", out);
            CHECK_MESSAGE(!json::parse(out, nullptr, false).is_discarded(), out);
        }
    }
}

TEST_CASE("grammar limits: min_remaining_tokens and fill_mask_within on a 128k byte-level vocabulary") {
    const std::string path = std::string(LATTICE_SHARED_DIR) + "/tokenizers/ggml-vocab-llama-bpe.gguf";
    const auto tok = load_tokenizer(path);
    const auto v = make_token_vocab(*tok);
    const auto g = compile(GrammarSpec::Kind::kJsonSchema,
                           R"({"type":"object","properties":{"age":{"type":"integer"},"name":{"type":"string"},
                               "tags":{"type":"array","items":{"type":"string","format":"date"}}},
                               "required":["age","name","tags"]})");
    GrammarMatcher m(g, v);
    auto ms = [](auto t0) {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    auto t0 = std::chrono::steady_clock::now();
    const int32_t first = m.min_remaining_tokens();
    const double cold = ms(t0);
    t0 = std::chrono::steady_clock::now();
    CHECK(m.min_remaining_tokens() == first);
    const double warm = ms(t0);
    // {"age":0,"name":"","tags":[]}: 29 bytes; far fewer tokens in a 128k BPE vocabulary.
    CHECK(m.distance() == 29);
    CHECK(first > 0);
    CHECK(first < 20);
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
    t0 = std::chrono::steady_clock::now();
    m.fill_mask_within(w, first);
    const double within = ms(t0);
    MESSAGE("128k vocabulary: shortest document " << first << " tokens; min_remaining_tokens " << cold
                                                  << " ms cold, " << warm << " ms warm; fill_mask_within " << within
                                                  << " ms (AMD EPYC Zen 4, one thread)");
    // Greedy on that mask (lowest id) ends well-formed within the promised tokens.
    int used = 0;
    std::string out;
    while (!m.complete() && used < first) {
        m.fill_mask_within(w, first - used);
        int32_t id = 0;
        while (!bit(w, id) || v->is_end(id)) ++id;
        REQUIRE(m.accept(id));
        out += v->bytes(id);
        ++used;
    }
    CHECK_MESSAGE(m.complete(), out);
    CHECK(!json::parse(out, nullptr, false).is_discarded());
    // Inside a string (almost every token allowed): the cost of a step far from and near the end.
    GrammarMatcher in_string(g, v);
    REQUIRE(in_string.accept_bytes("{\"age\":1,\"name\":\"ab"));
    double plain = 0, far = 0, near = 0;
    for (int rep = 0; rep < 3; ++rep) {
        t0 = std::chrono::steady_clock::now();
        in_string.fill_mask(w);
        plain = ms(t0);
        t0 = std::chrono::steady_clock::now();
        in_string.fill_mask_within(w, 200);
        far = ms(t0);
        t0 = std::chrono::steady_clock::now();
        in_string.fill_mask_within(w, 6);
        near = ms(t0);
    }
    MESSAGE("128k vocabulary inside a string: fill_mask " << plain << " ms, fill_mask_within 200 left " << far
                                                          << " ms, 6 left " << near << " ms (warm)");
}

}  // namespace test_grammar_limits
