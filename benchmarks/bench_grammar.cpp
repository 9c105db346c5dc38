// Structured output: the token mask's cost (runtime/engine/grammar.h) per generated token, at the
// vocabularies of real tokenizers (../shared/tokenizers: Llama 2's 32k SentencePiece, Llama 3's
// 128k byte-level BPE). For each grammar (json_object, a json_schema with nested objects, arrays,
// enums, $refs and bounded strings, a regex) the matcher is driven two ways, one fill_mask per token:
//   doc:  a fixed valid output tokenized greedily (longest vocabulary match at each byte), the
//         stream a model that writes well-formed output produces;
//   walk: tokens drawn at random from the mask itself (seeded; half the draws among the tokens that
//         close something, so walks end), which visits the rarer wide states.
//   cold: the doc again, on a grammar compiled afresh for each pass (its lazy DFA and mask memo empty:
//         what the first request with a new schema pays).
// Reported (thread CPU time): p50 / p99 / max / mean µs per mask over all tokens of --reps passes, and the floor: one
// walk of the whole trie (a grammar that allows every token, no shortcut) and one pass over the mask
// words. Also the TokenVocab build time. The built-in model's vocabulary (49k) comes first when its GGUF
// is there. Two sections about one heavy schema beside other requests:
//   props:  a schema of --props properties (all required, or all optional) along a valid document:
//           fill_mask, and fill_mask_within with the document's remaining tokens + 4 left (every step
//           inside the reserve's window), and max256: its first 256 tokens with max_tokens 256 (shorter
//           than the document: the reserve's masks that cannot keep their promise), each cold (a
//           fresh grammar) and warm;
//   engine: the built-in model, a plain 16-token completion alone and beside a request with that
//           schema (max_tokens 256): the plain request's ms per token (wall time).
// Mask times are this thread's CPU time (a loaded machine's preemptions are not the mask's). Usage:
//   bench_grammar [--reps 5] [--walks 20] [--props 200] [--props-only] [--engine-only] [--threads 2]
//                 [--json FILE] [--shared DIR] [--model GGUF]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "benchmarks/bench_common.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/engine/client.h"
#include "runtime/engine/grammar.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/weights/tensor_source.h"

using namespace lattice;

namespace {

const char* kSchema = R"({
  "$defs": {
    "Item": {"type": "object", "properties": {
        "sku": {"type": "string", "maxLength": 16},
        "qty": {"type": "integer", "minimum": 1, "maximum": 1000},
        "price": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
      "required": ["sku", "qty", "price"], "additionalProperties": false},
    "Status": {"type": "string", "enum": ["pending", "paid", "shipped", "delivered", "cancelled"]}
  },
  "type": "object",
  "properties": {
    "order_id": {"type": "string"},
    "customer": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "email": {"type": "string", "format": "email"},
        "vip": {"type": "boolean"}},
      "required": ["name", "email"], "additionalProperties": false},
    "status": {"$ref": "#/$defs/Status"},
    "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1},
    "notes": {"anyOf": [{"type": "string"}, {"type": "null"}]}
  },
  "required": ["order_id", "customer", "status", "items", "notes"],
  "additionalProperties": false
})";

const char* kSchemaDoc =
    R"({"order_id": "A-2026-000481", "customer": {"name": "Zoë Müller-Łukasiewicz", "email": "zoe@example.org", )"
    R"("vip": true}, "status": "shipped", "items": [{"sku": "LAT-128K", "qty": 3, "price": 19.99, "tags": ["gpu", )"
    R"("inference", "int8"]}, {"sku": "NV-H200", "qty": 1, "price": 31999.5, "tags": []}], "notes": "Leave the )"
    R"(parcel at the side door, please; ring twice. Fragile: contains glass \u2014 handle with care!"})";

const char* kObjectDoc =
    R"({"model": "llama-3.1-8b", "choices": [{"index": 0, "text": "The quick brown fox jumps over the lazy dog, )"
    R"(and then it naps.", "logprobs": null, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1284, )"
    R"("completion_tokens": 96, "total_tokens": 1380}, "meta": {"langs": ["en", "de", "日本語"], "score": -0.03125, )"
    R"("ok": true, "nested": {"a": [1, 2, [3, 4, {"b": "Привет, мир"}]], "emoji": "🙂👍"}}})";

const char* kRegex = R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z [a-z0-9._]+@[a-z]+\.(com|org|net)( [A-Z][a-z]+){1,8}\.)";
const char* kRegexDoc = "2026-12-04T19:58:26Z jane.doe_42@example.com Hello World Again From The Lattice Team.";

std::string default_model() {
    return (std::filesystem::path(__FILE__).parent_path().parent_path() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
        .string();
}

std::string default_shared() {
    return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "shared").string();
}

double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This thread's CPU time: what a mask costs, without the preemptions of a shared machine (masks run on
// one thread; wall time is kept for the engine's steps and the vocabulary build).
double cpu_us() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

// Longest vocabulary match at each byte.
std::vector<int32_t> greedy(const TokenVocab& v, const std::string& text) {
    std::unordered_map<std::string, int32_t> ids;
    size_t longest = 1;
    for (int32_t id = 0; id < v.size(); ++id)
        if (!v.bytes(id).empty() && ids.emplace(v.bytes(id), id).second)
            longest = std::max(longest, v.bytes(id).size());
    std::vector<int32_t> out;
    for (size_t i = 0; i < text.size();) {
        size_t n = std::min(longest, text.size() - i);
        for (; n > 0; --n) {
            auto it = ids.find(text.substr(i, n));
            if (it != ids.end()) {
                out.push_back(it->second);
                break;
            }
        }
        LATTICE_CHECK(n > 0, "bench_grammar: byte {} of the document is in no token", i);
        i += n;
    }
    return out;
}

bool bit(const std::vector<uint32_t>& w, int32_t id) {
    return (w[size_t(id / 32)] >> (id % 32)) & 1u;
}

struct Stats {
    std::vector<double> us;
    void add(double x) { us.push_back(x); }
    double pct(double p) {
        std::sort(us.begin(), us.end());
        return us.empty() ? 0 : us[std::min(us.size() - 1, size_t(p * double(us.size())))];
    }
    double mean() const {
        double s = 0;
        for (double x : us) s += x;
        return us.empty() ? 0 : s / double(us.size());
    }
};

void drive_doc(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenVocab>& v,
               const std::vector<int32_t>& ids, Stats& st) {
    GrammarMatcher m(g, v);
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
    for (int32_t id : ids) {
        const double t0 = cpu_us();
        m.fill_mask(w);
        st.add(cpu_us() - t0);
        LATTICE_CHECK(bit(w, id) && m.accept(id), "bench_grammar: the document's token {} was refused", id);
    }
    LATTICE_CHECK(m.complete(), "bench_grammar: the document is not complete");
}

void drive_walk(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenVocab>& v, std::mt19937& rng,
                Stats& st) {
    GrammarMatcher m(g, v);
    std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
    std::vector<int32_t> allowed, closing;
    for (int step = 0; step < 400 && !m.finished(); ++step) {
        const double t0 = cpu_us();
        m.fill_mask(w);
        st.add(cpu_us() - t0);
        allowed.clear();
        closing.clear();
        for (int32_t id = 0; id < v->size(); ++id) {
            if (!bit(w, id)) continue;
            allowed.push_back(id);
            if (v->is_end(id) || v->bytes(id).find_first_of("\"}]") != std::string::npos) closing.push_back(id);
        }
        const auto& pool = !closing.empty() && rng() % 2 ? closing : allowed;
        const int32_t id = pool[rng() % pool.size()];
        if (v->is_end(id)) break;
        m.accept(id);
    }
}


// A schema of n properties (string and integer alternately; all required, or all optional) and a valid
// document of it (every property present, short string values).
std::string props_schema(int n, bool required) {
    nlohmann::ordered_json s = {{"type", "object"}, {"properties", nlohmann::json::object()}};
    if (required) s["required"] = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
        const std::string k = "field_" + std::to_string(i);
        s["properties"][k] = {{"type", i % 2 ? "integer" : "string"}};
        if (required) s["required"].push_back(k);
    }
    return s.dump();
}

std::string props_doc(int n) {
    std::string d = "{";
    for (int i = 0; i < n; ++i) {
        d += (i ? ", \"field_" : "\"field_") + std::to_string(i) + "\": ";
        d += i % 2 ? std::to_string(i * 37 % 1000) : "\"value " + std::to_string(i) + " of the record\"";
    }
    return d + "}";
}

// The n-property schemas: µs per mask along the document, plain (fill_mask) and within the reserve
// (fill_mask_within with the document's remaining tokens + 4 left: every step inside the scheduler's
// finishing window), each on a grammar compiled afresh (cold: its caches empty) and again (warm).
void bench_props(const std::string& file, const std::shared_ptr<const TokenVocab>& v, int n, int reps,
                 nlohmann::json& results) {
    const std::string doc = props_doc(n);
    const std::vector<int32_t> ids = greedy(*v, doc);
    for (bool required : {true, false}) {
        const GrammarSpec spec{GrammarSpec::Kind::kJsonSchema, props_schema(n, required), {}};
        for (const char* mode : {"plain", "within", "max256"}) {
            const bool within = std::strcmp(mode, "within") == 0, max256 = std::strcmp(mode, "max256") == 0;
            const size_t steps = max256 ? std::min<size_t>(ids.size(), 256) : ids.size();
            Stats cold, warm;
            int64_t refused = 0;
            for (int r = 0; r < reps; ++r) {
                const auto g = Grammar::compile(spec);
                for (Stats* st : {&cold, &warm}) {
                    GrammarMatcher m(g, v);
                    std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
                    for (size_t i = 0; i < steps; ++i) {
                        const double t0 = cpu_us();
                        if (within || max256)
                            m.fill_mask_within(w, within ? int64_t(ids.size() - i) + 4 : int64_t(256 - i));
                        else
                            m.fill_mask(w);
                        st->add(cpu_us() - t0);
                        refused += !bit(w, ids[i]);  // (within: the reserve's bound is not exact past 256 states)
                        LATTICE_CHECK(m.accept(ids[i]), "bench_grammar: token {} refused", i);
                    }
                    LATTICE_CHECK(max256 || m.complete(), "bench_grammar: the document is not complete");
                }
            }
            for (auto [name, st] : {std::pair<const char*, Stats*>{"cold", &cold}, {"warm", &warm}}) {
                const std::string grammar = fmt::format("{}{}", n, required ? "req" : "opt");
                const std::string m = fmt::format("{}-{}", mode, name);
                const double p50 = st->pct(0.5), p99 = st->pct(0.99), mx = st->pct(1.0), mean = st->mean();
                fmt::print("{:<26} {:>7} {:<12} {:<12} {:>6} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f}  "
                           "({:.1f} ms in all{})\n",
                           file, v->size(), grammar, m, st->us.size(), p50, p99, mx, mean,
                           mean * double(steps) * 1e-3,
                           refused ? fmt::format(", {} doc tokens outside the mask", refused) : "");
                results.push_back({{"tokenizer", file}, {"vocab", v->size()}, {"grammar", "props" + grammar},
                                   {"mode", m}, {"masks", st->us.size()}, {"doc_tokens", ids.size()},
                                   {"p50_us", p50}, {"p99_us", p99}, {"max_us", mx}, {"mean_us", mean}});
            }
        }
    }
}


// One schema-heavy request beside a plain one, on the built-in model (--threads): a plain 16-token
// completion alone, then submitted just after a request with the n-property schema (max_tokens 256:
// its shortest document is longer, so every mask of it is the reserve's). Reported: the plain
// request's ms per token (first token to last) and its total time, median over reps.
void bench_engine(const std::string& model_path, int props, int reps, int threads, nlohmann::json& results) {
    auto src = open_model(model_path);
    auto tok = load_tokenizer(model_path);
    CpuBackend be(CpuBackendOptions{threads, false, false});
    ModelOptions mo;
    mo.max_seq = 1024;
    Model model(*src, be, mo, nullptr);
    auto engine = make_local_engine(model);
    EngineClient client(*engine, tok.get(), true);
    const GrammarSpec spec{GrammarSpec::Kind::kJsonSchema, props_schema(props, true), {}};
    for (bool beside : {false, true}) {
        Stats per_token, total;
        int64_t schema_tokens = 0;
        for (int r = 0; r < reps; ++r) {
            int64_t schema_id = -1, plain_id = -1;
            if (beside) {
                ClientRequest s;
                s.prompt = tok->encode("Fill in the record as JSON.");
                s.max_tokens = 256;
                s.grammar = Grammar::compile(spec);  // a new request's grammar: its caches empty
                schema_id = client.submit(std::move(s));
            }
            ClientRequest p;
            p.prompt = tok->encode("Write a short story about a lighthouse keeper.");
            p.max_tokens = 16;
            p.ignore_eos = true;
            const double t0 = now_us();
            plain_id = client.submit(std::move(p));
            double first = -1, last = -1;
            for (bool done = false; !done;)
                for (const ClientEvent& e : client.poll()) {
                    if (e.id == schema_id && e.token >= 0) ++schema_tokens;
                    if (e.id != plain_id) continue;
                    if (first < 0) first = now_us();
                    last = now_us();
                    done |= e.finish != FinishReason::kNone;
                }
            if (schema_id >= 0) client.cancel(schema_id);
            while (client.busy()) client.poll();
            per_token.add((last - first) / 15 * 1e-3);
            total.add((last - t0) * 1e-3);
        }
        const char* mode = beside ? "beside-schema" : "alone";
        fmt::print("engine (built-in model, {} threads): plain 16 tokens {:<14} {:>7.1f} ms/token, {:>7.1f} ms in all "
                   "(median of {}; the {}-property schema request made {} tokens meanwhile)\n",
                   threads, mode, per_token.pct(0.5), total.pct(0.5), reps, props, schema_tokens);
        results.push_back({{"grammar", fmt::format("props{}req", props)}, {"mode", std::string("engine-") + mode},
                           {"plain_ms_per_token", per_token.pct(0.5)}, {"plain_total_ms", total.pct(0.5)},
                           {"schema_tokens", schema_tokens}, {"reps", reps}, {"threads", threads}});
    }
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 5, walks = 20, props = 200, threads = 2;
    bool props_only = false, engine_only = false, floor_only = false;
    std::string json_file, shared = default_shared(), model = default_model();
    for (int i = 1; i < argc; ++i) {
        auto arg = [&](const char* name) { return std::strcmp(argv[i], name) == 0 && i + 1 < argc; };
        if (arg("--reps"))
            reps = std::max(1, std::atoi(argv[++i]));
        else if (arg("--walks"))
            walks = std::max(0, std::atoi(argv[++i]));
        else if (arg("--json"))
            json_file = argv[++i];
        else if (arg("--shared"))
            shared = argv[++i];
        else if (arg("--model"))
            model = argv[++i];
        else if (arg("--threads"))
            threads = std::max(1, std::atoi(argv[++i]));
        else if (arg("--props"))
            props = std::max(1, std::atoi(argv[++i]));
        else if (std::strcmp(argv[i], "--props-only") == 0)
            props_only = true;
        else if (std::strcmp(argv[i], "--engine-only") == 0)
            engine_only = true;
        else if (std::strcmp(argv[i], "--floor-only") == 0)  // the full trie walk only (A/B of the walk)
            floor_only = true;
        else {
            fmt::print(stderr,
                       "usage: {} [--reps 5] [--walks 20] [--props 200] [--props-only] [--engine-only] "
                       "[--threads 2] [--json FILE] [--shared DIR] [--model GGUF]\n",
                       argv[0]);
            return 2;
        }
    }
    nlohmann::json results = nlohmann::json::array();
    try {
        struct Kind {
            const char* name;
            GrammarSpec spec;
            const char* doc;
        };
        std::vector<Kind> kinds = {{"json_object", {GrammarSpec::Kind::kJsonObject, "", {}}, kObjectDoc},
                                   {"json_schema", {GrammarSpec::Kind::kJsonSchema, kSchema, {}}, kSchemaDoc},
                                   {"regex", {GrammarSpec::Kind::kRegex, kRegex, {}}, kRegexDoc}};
        const auto any = Grammar::compile({GrammarSpec::Kind::kRegex, "(.|\n)*", {}});
        fmt::print("{:<26} {:>7} {:<12} {:<5} {:>6} {:>8} {:>8} {:>8} {:>8}\n", "tokenizer", "vocab", "grammar", "mode",
                   "masks", "p50 µs", "p99 µs", "max µs", "mean µs");
        if (std::filesystem::exists(model)) bench_engine(model, props, reps, threads, results);
        std::vector<std::string> files = {shared + "/tokenizers/ggml-vocab-llama-spm.gguf",
                                          shared + "/tokenizers/ggml-vocab-llama-bpe.gguf"};
        if (std::filesystem::exists(model)) files.insert(files.begin(), model);
        if (engine_only) files.clear();
        for (const std::string& path : files) {
            const std::string file = std::filesystem::path(path).filename().string();
            const auto tok = load_tokenizer(path);
            double t0 = now_us();
            const auto v = make_token_vocab(*tok);
            const double build_ms = (now_us() - t0) * 1e-3;
            if (!floor_only) bench_props(file, v, props, reps, results);
            if (props_only) continue;
            // The floor: every token allowed and walked (no plain-string shortcut), and the mask words alone.
            Stats floor_walk, floor_words;
            std::vector<uint32_t> w(size_t((v->size() + 31) / 32));
            GrammarMatcher all(any, v);
            Stats cold_walk;
            for (int r = 0; r < reps; ++r) {
                GrammarMatcher fresh(Grammar::compile({GrammarSpec::Kind::kRegex, "(.|\n)*", {}}), v);
                t0 = cpu_us();
                fresh.fill_mask(w);
                cold_walk.add(cpu_us() - t0);
                any->cache().masks.clear();  // the walk itself, not the memo
                t0 = cpu_us();
                all.fill_mask(w);
                floor_walk.add(cpu_us() - t0);
                t0 = cpu_us();
                std::fill(w.begin(), w.end(), 0xFFFFFFFFu);
                floor_words.add(cpu_us() - t0);
            }
            fmt::print(
                "{:<26} {:>7} vocab build {:.1f} ms, trie {} nodes ({} outside plain strings); floor: full trie walk "
                "{:.0f} µs (cold {:.0f} "
                "µs), mask words {:.2f} µs\n",
                file, v->size(), build_ms, v->trie().byte.size(), v->nonplain_trie().byte.size(), floor_walk.pct(0.5),
                cold_walk.pct(0.5), floor_words.pct(0.5));
            nlohmann::json row_v = {{"tokenizer", file},
                                    {"vocab", v->size()},
                                    {"vocab_build_ms", build_ms},
                                    {"trie_nodes", v->trie().byte.size()},
                                    {"nonplain_trie_nodes", v->nonplain_trie().byte.size()},
                                    {"full_walk_us", floor_walk.pct(0.5)}};
            for (Kind& k : floor_only ? std::vector<Kind>{} : kinds) {
                const auto g = Grammar::compile(k.spec);
                const std::vector<int32_t> ids = greedy(*v, k.doc);
                {  // finishing mode halfway through the document: distance() and the finishing mask, first and again
                    GrammarMatcher m(Grammar::compile(k.spec), v);
                    for (size_t i = 0; i < ids.size() / 2; ++i) m.accept(ids[i]);
                    std::vector<uint32_t> fw(size_t((v->size() + 31) / 32));
                    double t = cpu_us();
                    const int32_t dist = m.distance();
                    const double dist_us = cpu_us() - t;
                    t = cpu_us();
                    m.fill_mask_finishing(fw);
                    const double first_us = cpu_us() - t;
                    t = cpu_us();
                    m.fill_mask_finishing(fw);
                    const double again_us = cpu_us() - t;
                    fmt::print(
                        "{:<26} {:>7} {:<12} finishing at token {}: distance {} bytes ({:.0f} µs), mask {:.0f} µs "
                        "first, {:.0f} µs again\n",
                        file, v->size(), k.name, ids.size() / 2, dist, dist_us, first_us, again_us);
                    nlohmann::json row = row_v;
                    row.update({{"grammar", k.name},
                                {"mode", "finishing"},
                                {"distance", dist},
                                {"distance_us", dist_us},
                                {"first_us", first_us},
                                {"again_us", again_us}});
                    results.push_back(row);
                }
                std::mt19937 rng(42);
                for (const char* mode : {"cold", "doc", "walk"}) {
                    Stats st;
                    if (std::strcmp(mode, "cold") == 0)  // a grammar compiled afresh each pass: its caches empty
                        for (int r = 0; r < reps; ++r) drive_doc(Grammar::compile(k.spec), v, ids, st);
                    else if (std::strcmp(mode, "doc") == 0)
                        for (int r = 0; r < reps; ++r) drive_doc(g, v, ids, st);
                    else
                        for (int r = 0; r < walks; ++r) drive_walk(g, v, rng, st);
                    const size_t n = st.us.size();
                    const double p50 = st.pct(0.5), p99 = st.pct(0.99), mx = st.pct(1.0), mean = st.mean();
                    fmt::print("{:<26} {:>7} {:<12} {:<5} {:>6} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f}\n", file, v->size(),
                               k.name, mode, n, p50, p99, mx, mean);
                    nlohmann::json row = row_v;
                    row.update({{"grammar", k.name},
                                {"mode", mode},
                                {"masks", n},
                                {"p50_us", p50},
                                {"p99_us", p99},
                                {"max_us", mx},
                                {"mean_us", mean}});
                    row["cached_sets"] = g->cache().sets.size();
                    results.push_back(row);
                }
            }
        }
    } catch (const Error& e) {
        fmt::print(stderr, "bench_grammar: error: {}\n", e.what());
        return 1;
    }
    for (auto& r : results)
        if (r["mode"] == "walk" && r.contains("cached_sets"))
            fmt::print("{} {}: {} configuration sets cached\n", r["tokenizer"].get<std::string>(),
                       r["grammar"].get<std::string>(), r["cached_sets"].get<size_t>());
    bench::write_json(json_file, {{"bench", "grammar"}, {"results", results}});
    return 0;
}
