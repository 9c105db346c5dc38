// The pieces of a converted checkpoint's format: SHA-256 (known vectors, incremental == one shot ==
// file), the streaming safetensors writer (pieces, order and size checks, metadata, hash of what
// was written), the manifest (config round trip, every rejected field named), and the
// metadata-only tokenizer GGUF (same keys and same tokenizer as the source).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/weights/gguf_writer.h"
#include "runtime/weights/manifest.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/sha256.h"
#include "tests/test_error.h"
#include "tests/test_temp_dir.h"

using namespace lattice;
namespace fs = std::filesystem;
using lattice::testing::error_of;
using lattice::testing::TempDir;

namespace {

std::string golden(const std::string& rel) {
    return std::string(LATTICE_SHARED_DIR) + "/golden/" + rel;
}

Manifest sample_manifest() {
    Manifest m;
    m.config = load_hf_config(golden("tiny-gqa-llama3/config.json"));
    m.tp = 2;
    m.pp = 2;
    m.stage_layers = {2, 2};
    m.quant = "w8a8";
    for (int r = 0; r < 4; ++r) m.files.push_back({rank_file_name(r, 4), "rank", r, 100 + r, std::string(64, 'a')});
    m.files.push_back({"tokenizer.json", "tokenizer", -1, 7, std::string(64, 'b')});
    return m;
}

}  // namespace

TEST_CASE("SHA-256: FIPS 180-2 vectors, incremental equals one shot equals the file") {
    CHECK(sha256_hex("", 0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(sha256_hex("abc", 3) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    CHECK(sha256_hex(two.data(), two.size()) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    std::vector<uint8_t> data(10'000'019);
    std::mt19937 rng(5);
    for (auto& b : data) b = uint8_t(rng());
    Sha256 h;
    for (size_t off = 0; off < data.size(); off += 77'777)
        h.update(data.data() + off, std::min<size_t>(77'777, data.size() - off));
    const std::string inc = sha256_hex(h.finish());
    CHECK(inc == sha256_hex(data.data(), data.size()));
    TempDir d;
    const auto p = (d.path / "blob").string();
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
    int64_t seen = 0;
    CHECK(sha256_file(p, [&](int64_t n) { seen += n; }) == inc);
    CHECK(seen == int64_t(data.size()));
    CHECK(is_sha256_hex(inc));
    CHECK_FALSE(is_sha256_hex(std::string(63, 'a')));
    CHECK_FALSE(is_sha256_hex(std::string(64, 'A')));
    CHECK(error_of([&] { sha256_file((d.path / "nope").string()); }).find("nope") != std::string::npos);
}

TEST_CASE("SafetensorsWriter: tensors in pieces, metadata, hash of the written file, misuse rejected") {
    TempDir d;
    const std::string p = (d.path / "a.safetensors").string();
    std::vector<float> a(1000);
    std::vector<int8_t> b(3 * 7);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = int8_t(int(i) - 10);
    SafetensorsWriter w(p, {{"a", DType::kF32, {10, 100}}, {"b", DType::kI8, {3, 7}}, {"empty", DType::kF32, {0}}},
                        {{"format", "x"}, {"rank", "3"}});
    CHECK(w.data_bytes() == 4000 + 21);
    CHECK_THROWS_AS(w.write("b", b.data(), 21), Error);  // out of order
    w.write("a", a.data(), 1000);                        // in pieces
    w.write("a", reinterpret_cast<const uint8_t*>(a.data()) + 1000, 3000);
    CHECK_THROWS_AS(w.write("b", b.data(), 22), Error);  // overflow
    w.write("b", b.data(), 21);
    const auto r = w.finish();
    CHECK(r.bytes == int64_t(fs::file_size(p)));
    CHECK(r.sha256 == sha256_file(p));
    SafetensorsFile f(p);
    CHECK(f.metadata().at("rank") == "3");
    CHECK(std::memcmp(f.bytes(*f.find("a")), a.data(), 4000) == 0);
    CHECK(std::memcmp(f.bytes(*f.find("b")), b.data(), 21) == 0);
    CHECK(f.find("empty") != nullptr);

    SafetensorsWriter w2((d.path / "b.safetensors").string(), {{"x", DType::kF32, {4}}});
    w2.write("x", a.data(), 8);
    CHECK(error_of([&] { w2.finish(); }).find("\"x\" incomplete") != std::string::npos);
}

TEST_CASE("hf_config_json: parse_hf_config gives back every field (presets, golden and family configs)") {
    std::vector<ModelConfig> cfgs;
    for (const auto& n : preset_names()) cfgs.push_back(preset_config(n));
    for (const char* g : {"tiny-llama2", "tiny-gqa-llama3", "tiny-fp16-tied"})
        cfgs.push_back(load_hf_config(golden(std::string(g) + "/config.json")));
    cfgs.back().rope_scaling = RopeScaling{"linear", 2.5, 1.0, 4.0, 8192};
    // The families' windows (Qwen2's from max_window_layers on) and experts.
    for (const char* f : {"qwen2", "qwen2-swa", "mistral", "mixtral"})
        cfgs.push_back(load_hf_config(std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/model/families/" + f +
                                      "/config.json"));
    for (const ModelConfig& c : cfgs) {
        CAPTURE(c.source);
        const ModelConfig r = parse_hf_config(hf_config_json(c), "round trip");
        CHECK(r.architecture == c.architecture);
        CHECK(r.hidden == c.hidden);
        CHECK(r.intermediate == c.intermediate);
        CHECK(r.n_layers == c.n_layers);
        CHECK(r.n_heads == c.n_heads);
        CHECK(r.n_kv_heads == c.n_kv_heads);
        CHECK(r.head_dim == c.head_dim);
        CHECK(r.vocab == c.vocab);
        CHECK(r.max_position == c.max_position);
        CHECK(r.rms_eps == c.rms_eps);
        CHECK(r.rope_theta == c.rope_theta);
        CHECK(r.rope_scaling.type == c.rope_scaling.type);
        CHECK(r.rope_inv_freq() == c.rope_inv_freq());
        CHECK(r.tie_embeddings == c.tie_embeddings);
        CHECK(r.bos_id == c.bos_id);
        CHECK(r.eos_ids == c.eos_ids);
        CHECK(r.family == c.family);
        CHECK(r.sliding_window == c.sliding_window);
        CHECK(r.window_layer_begin == c.window_layer_begin);
        CHECK(r.n_experts == c.n_experts);
        CHECK(r.n_experts_used == c.n_experts_used);
    }
}

TEST_CASE("manifest: round trip, and each bad field named") {
    const Manifest m = sample_manifest();
    const Manifest r = parse_manifest(manifest_json(m), "m.json");
    CHECK(r.sealed);
    CHECK(r.tp == 2);
    CHECK(r.pp == 2);
    CHECK(r.stage_layers == m.stage_layers);
    CHECK(r.quant == "w8a8");
    CHECK(r.files.size() == 5);
    CHECK(r.rank_file(3).path == "rank-00003-of-00004.safetensors");
    CHECK(r.rank_file(3).bytes == 103);
    CHECK(r.config.n_layers == 4);
    const PreparedLayout p = r.layout("dir", 3);
    CHECK(p.tp_rank() == 1);
    CHECK(p.pp_rank() == 1);

    auto bad = [&](const std::function<void(nlohmann::json&)>& edit) {
        nlohmann::json j = nlohmann::json::parse(manifest_json(m));
        edit(j);
        return error_of([&] { parse_manifest(j.dump(), "m.json"); });
    };
    CHECK(bad([](auto& j) { j["format_version"] = 2; }).find("format version 2, but this lattice reads version 1") !=
          std::string::npos);
    CHECK(bad([](auto& j) { j["format"] = "other"; }).find("not a lattice converted checkpoint") != std::string::npos);
    CHECK(bad([](auto& j) { j["layout"]["stage_layers"] = {1, 2}; }).find("add up to 3 layers") != std::string::npos);
    CHECK(bad([](auto& j) { j["layout"]["tp"] = 0; }).find("\"tp\"") != std::string::npos);
    CHECK(bad([](auto& j) { j["quantization"]["mode"] = "w4"; }).find("\"w4\" unknown") != std::string::npos);
    CHECK(bad([](auto& j) { j["files"][1]["path"] = "../x"; }).find("not a plain file name") != std::string::npos);
    CHECK(bad([](auto& j) { j["files"][1]["sha256"] = "xyz"; }).find("64 lowercase hex") != std::string::npos);
    CHECK(bad([](auto& j) { j["files"][1]["rank"] = 0; }).find("second file for rank 0") != std::string::npos);
    CHECK(bad([](auto& j) { j["files"].erase(2); }).find("lists 3 rank files for tp 2 x pp 2") != std::string::npos);
    CHECK(bad([](auto& j) { j["files"][0]["bytes"] = -1; }).find("\"bytes\"") != std::string::npos);
    CHECK(bad([](auto& j) { j["config"]["num_hidden_layers"] = "four"; }).find("num_hidden_layers") !=
          std::string::npos);
    CHECK(error_of([] { parse_manifest("{", "m.json"); }).find("not valid JSON") != std::string::npos);
    // Run defaults: absent is auto; a KV cache dtype round-trips into the layout; others are refused.
    CHECK(r.kv_cache_dtype == "auto");
    Manifest with = m;
    with.kv_cache_dtype = "int8";
    const Manifest wr = parse_manifest(manifest_json(with), "m.json");
    CHECK(wr.kv_cache_dtype == "int8");
    CHECK(wr.layout("dir", 0).kv_cache_dtype == "int8");
    CHECK(bad([](auto& j) { j["defaults"] = {{"kv_cache_dtype", "fp4"}}; }).find("kv_cache_dtype \"fp4\" unknown") !=
          std::string::npos);
    CHECK(bad([](auto& j) { j["defaults"] = {{"threads", 4}}; }).find("unknown field \"threads\"") !=
          std::string::npos);
    // The seal: a valid but changed value is refused (or reported, with seal_problem), reformatting is not.
    CHECK(bad([](auto& j) { j["config"]["vocab_size"] = 321; }).find("m.json: the SHA-256 of its content") !=
          std::string::npos);
    CHECK(bad([](auto& j) { j["layout"]["stage_layers"] = {3, 1}; }).find("edited or damaged") != std::string::npos);
    std::string problem = "unset";
    const Manifest edited = parse_manifest(
        [&] {
            nlohmann::json j = nlohmann::json::parse(manifest_json(m));
            j["quantization"]["quant_head"] = true;
            return j.dump(3);
        }(),
        "m.json", &problem);
    CHECK(edited.quant_head);
    CHECK(problem.find("differs from its \"manifest_sha256\"") != std::string::npos);
    CHECK(parse_manifest(nlohmann::json::parse(manifest_json(m)).dump(), "m.json", &problem).sealed);
    CHECK(problem.empty());
    TempDir d;
    CHECK(error_of([&] { read_manifest(d.path.string()); }).find("no manifest.json") != std::string::npos);
}

TEST_CASE("tokenizer.gguf: the source's tokenizer keys, loaded as the same tokenizer") {
    TempDir d;
    for (const char* g : {"gguf/tiny-llama2.f32.gguf", "gguf/tiny-fp16-tied.f16.gguf"}) {
        CAPTURE(g);
        auto src = GgufFile::open(golden(g));
        const auto keys = gguf_tokenizer_keys(*src);
        REQUIRE(keys.size() > 3);
        const std::string out = (d.path / "tokenizer.gguf").string();
        write_gguf_metadata(out, *src, keys);
        auto back = GgufFile::open(out);
        CHECK(back->keys() == keys);
        CHECK(back->tensors().empty());
        CHECK(back->string_array("tokenizer.ggml.tokens") == src->string_array("tokenizer.ggml.tokens"));
        CHECK(back->float_array("tokenizer.ggml.scores") == src->float_array("tokenizer.ggml.scores"));
        CHECK(back->int_array("tokenizer.ggml.token_type") == src->int_array("tokenizer.ggml.token_type"));
        auto a = load_tokenizer(golden(g)), b = load_tokenizer(d.path.string());  // the folder finds tokenizer.gguf
        const std::string text = "Hello world, abc def";
        CHECK(a->encode(text, true, false) == b->encode(text, true, false));
        CHECK(a->vocab_size() == b->vocab_size());
    }
}
