// Structured output (runtime/engine/grammar.h) over whole outputs: random walks over the mask on a small
// vocabulary (every output parses and validates against the schema checker of grammar_test_util.h; regex
// outputs against std::regex_match), a 32k and a 128k real vocabulary (../shared/tokenizers), one grammar
// masked from several threads and after a cache clear (the same masks), finishing masks that end the output
// within distance() tokens, and a pydantic / OpenAI strict schema walked to valid output. The byte-level
// checks of each grammar kind are in test_grammar.cpp.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/grammar.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/runtime/engine/grammar_test_util.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_grammar_walks {

using namespace lattice;
using namespace lattice::grammar_test;  // its json is nlohmann::json

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

}  // namespace test_grammar_walks
